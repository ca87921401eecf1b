"""Draw the course's diagrams into images/ (run: `make images`).

Each diagram is a function returning a matplotlib figure; ALT_TEXT holds the alt text
the lessons use for it, so that the words and the picture are kept together.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

IMAGES = Path(__file__).resolve().parent.parent / "images"

ALT_TEXT = {
    "process_topology.png": (
        "Two nodes, each running torchrun with two worker processes. Node 0 holds global "
        "ranks 0 and 1 with local ranks 0 and 1 on cuda:0 and cuda:1; node 1 holds global "
        "ranks 2 and 3, again with local ranks 0 and 1 on cuda:0 and cuda:1. World size 4. "
        "All ranks meet at MASTER_ADDR:MASTER_PORT on node 0."
    ),
    "ddp_step.png": (
        "One training step with DDP on 2 ranks. A global batch of 192 samples is dealt "
        "out: rank 0 gets 96 and rank 1 the other 96. Each rank holds the same model, "
        "runs forward and backward on its 96 samples and gets its own gradients. An "
        "all-reduce averages the gradients across the ranks, so both ranks take the same "
        "optimizer step and their models stay identical: the step one process takes with "
        "all 192 samples."
    ),
}


def _box(ax, x, y, w, h, color, text="", size=10, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#333333", linewidth=1.2))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                weight=weight)


def process_topology(nodes: int = 2, per_node: int = 2):
    """Nodes, local ranks, global ranks and the world size, as torchrun numbers them."""
    fig, ax = plt.subplots(figsize=(9, 4.6))
    node_w, gap = 4.0, 0.6
    for node in range(nodes):
        x0 = node * (node_w + gap)
        _box(ax, x0, 0, node_w, 3.6, "#eef3fb")
        ax.text(x0 + 0.15, 3.35, f"node {node}  (GROUP_RANK={node})", fontsize=11,
                weight="bold", va="center")
        ax.text(x0 + 0.15, 2.95, f"torchrun --nnodes={nodes} --nproc-per-node={per_node}",
                fontsize=8.5, family="monospace", va="center")
        slot = (node_w - 0.3) / per_node
        for local in range(per_node):
            rank = node * per_node + local
            x = x0 + 0.15 + local * slot
            _box(ax, x + 0.05, 0.25, slot - 0.2, 2.3, "#ffffff")
            ax.text(x + slot / 2 - 0.05, 2.2, f"RANK={rank}", ha="center", fontsize=11,
                    weight="bold")
            ax.text(x + slot / 2 - 0.05, 1.75, f"LOCAL_RANK={local}", ha="center", fontsize=9.5)
            ax.text(x + slot / 2 - 0.05, 1.35, "one process", ha="center", fontsize=8.5,
                    color="#555555")
            _box(ax, x + 0.3, 0.45, slot - 0.7, 0.55, "#d9ead3", f"cuda:{local}", size=9.5)
    total_w = nodes * node_w + (nodes - 1) * gap
    ax.annotate("", xy=(0.6, 3.62), xytext=(total_w - 0.6, 3.62),
                arrowprops=dict(arrowstyle="->", color="#aa3333", lw=1.4,
                                connectionstyle="arc3,rad=0.12"))
    ax.text(total_w / 2, 4.55, "all ranks meet at MASTER_ADDR:MASTER_PORT (on node 0)",
            ha="center", fontsize=10, color="#aa3333")
    ax.text(total_w / 2, -0.45,
            f"WORLD_SIZE = {nodes} nodes x {per_node} processes = {nodes * per_node};  "
            f"LOCAL_WORLD_SIZE = {per_node}", ha="center", fontsize=10.5)
    ax.set_xlim(-0.2, total_w + 0.2)
    ax.set_ylim(-0.7, 4.8)
    ax.axis("off")
    fig.tight_layout()
    return fig


def ddp_step(ranks: int = 2, batch: int = 192):
    """One DDP step: the batch dealt out, a forward and backward per rank, the gradients
    averaged by an all-reduce, the same step everywhere."""
    fig, ax = plt.subplots(figsize=(9, 3.9))
    share = batch // ranks
    _box(ax, 0, 1.2, 1.7, 1.2, "#fff2cc", f"global batch\n{batch} samples", size=10,
         weight="bold")
    lane_h, top = 1.5, 3.3
    for rank in range(ranks):
        y = top - rank * (lane_h + 0.35) - lane_h
        ax.annotate("", xy=(2.3, y + lane_h / 2), xytext=(1.7, 1.8),
                    arrowprops=dict(arrowstyle="->", color="#555555", lw=1.2))
        _box(ax, 2.3, y, 6.2, lane_h, "#eef3fb")
        ax.text(2.45, y + lane_h - 0.22, f"rank {rank}", fontsize=10.5, weight="bold",
                va="center")
        _box(ax, 2.45, y + 0.2, 1.2, 0.75, "#ffffff", f"{share}\nsamples", size=9)
        _box(ax, 3.9, y + 0.2, 1.7, 0.75, "#d9ead3", "same model:\nforward, backward",
             size=8.5)
        _box(ax, 5.85, y + 0.2, 1.2, 0.75, "#ffffff", "its own\ngradients", size=9)
        _box(ax, 9.6, y + 0.2, 1.6, 0.75, "#d9ead3", "optimizer step\n(the same)", size=9)
        ax.annotate("", xy=(9.6, y + 0.57), xytext=(8.5, y + 0.57),
                    arrowprops=dict(arrowstyle="->", color="#555555", lw=1.2))
    _box(ax, 7.25, 0.05, 1.05, 3.1, "#f4cccc", "all-reduce:\naverage\nthe\ngradients",
         size=9, weight="bold")
    ax.text(5.6, -0.35, "every rank ends the step with the same weights: the step one "
            f"process takes with all {batch} samples", ha="center", fontsize=10)
    ax.set_xlim(-0.1, 11.3)
    ax.set_ylim(-0.6, 3.5)
    ax.axis("off")
    fig.tight_layout()
    return fig


DIAGRAMS = {"process_topology.png": process_topology, "ddp_step.png": ddp_step}


def main(dest: Path = IMAGES) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in DIAGRAMS.items():
        fig = draw()
        path = dest / name
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else IMAGES)
