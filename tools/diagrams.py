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
        "One DDP step on 2 ranks: a global batch of 192 samples is split 96 and 96. Each "
        "rank runs forward and backward on its half with the same model; an all-reduce "
        "averages their gradients, so both take the same optimizer step, the one a single "
        "process takes with all 192 samples."
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



def ring_allreduce(n: int = 3):
    """Ring all-reduce on n ranks, step by step: each rank's tensor cut into n chunks, n-1
    reduce-scatter steps (send right, add what comes from the left), then n-1 all-gather
    steps (send right, overwrite), with who sends which chunk to whom."""
    names = "abcdefgh"[:n]
    held = [[{r} for _ in range(n)] for r in range(n)]  # held[r][c]: ranks summed in
    panels = [("start, own values", held, [])]
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            sends = [((r - step) % n if phase == "reduce-scatter" else (r - step + 1) % n)
                     for r in range(n)]
            new = [[set(s) for s in row] for row in held]
            for r in range(n):
                c, dst = sends[r], (r + 1) % n
                new[dst][c] = held[dst][c] | held[r][c] if phase == "reduce-scatter" \
                    else set(held[r][c])
            panels.append((f"{phase}, step {step}", held, sends))
            held = new
    panels.append(("end, all hold the sum", held, []))

    cell_w, cell_h, gap_x, row_h = 0.62, 0.5, 0.55, 0.95
    panel_w = n * cell_w + gap_x
    fig, ax = plt.subplots(figsize=(1.95 * len(panels) + 0.4, 1.15 * n + 2.0))
    for p, (label, state, sends) in enumerate(panels):
        x0 = 0.9 + p * panel_w
        color = "#fde9d9" if "reduce" in label else "#e2efda" if "gather" in label \
            else "#f3f3f3"
        ax.add_patch(FancyBboxPatch((x0 - 0.12, -0.45), n * cell_w + 0.24, n * row_h + 0.2,
                                    boxstyle="round,pad=0.02", facecolor=color,
                                    edgecolor="none"))
        ax.text(x0 + n * cell_w / 2, n * row_h + 0.1, label.replace(", ", ",\n"),
                ha="center", va="bottom", fontsize=8.5, weight="bold")
        for c in range(n):
            ax.text(x0 + (c + 0.5) * cell_w, n * row_h - 0.3, names[c],
                    ha="center", fontsize=8, color="#555555")
        for r in range(n):
            y = (n - 1 - r) * row_h - 0.25
            if p == 0:
                ax.text(0.75, y + cell_h / 2, f"rank {r}", ha="right", va="center",
                        fontsize=9.5, weight="bold")
            for c in range(n):
                done = len(state[r][c]) == n
                text = "sum" if done else "+".join(str(k) for k in sorted(state[r][c]))
                sent = bool(sends) and sends[r] == c
                ax.add_patch(FancyBboxPatch(
                    (x0 + c * cell_w + 0.03, y), cell_w - 0.06, cell_h,
                    boxstyle="round,pad=0.01,rounding_size=0.05",
                    facecolor="#9fc5e8" if done else "#ffffff",
                    edgecolor="#cc0000" if sent else "#333333", linewidth=2.2 if sent else 1))
                ax.text(x0 + (c + 0.5) * cell_w, y + cell_h / 2, text, ha="center",
                        va="center", fontsize=7.5, weight="bold" if done else "normal")
            if sends:
                ax.text(x0 + n * cell_w / 2, y - 0.13,
                        f"sends {names[sends[r]]} to rank {(r + 1) % n}", ha="center",
                        va="center", fontsize=6.8, color="#cc0000")
    right = 0.9 + len(panels) * panel_w - gap_x
    ax.text(right / 2 + 0.4, -0.85,
            f"Each step, every rank sends one chunk (red) to its right neighbour. "
            f"{n - 1} steps of reduce-scatter add it in, {n - 1} steps of all-gather copy "
            f"the finished sums.", ha="center", fontsize=9)
    ax.text(right / 2 + 0.4, -1.2,
            f"Each rank sends 2(n-1) = {2 * (n - 1)} chunks of N/n elements: "
            f"2(n-1)/n x N = {2 * (n - 1)}/{n} N, never more than 2N however many ranks. "
            "In a box: the ranks whose values it holds, added up.",
            ha="center", fontsize=9)
    ax.set_xlim(0, right + 0.1)
    ax.set_ylim(-1.4, n * row_h + 0.75)
    ax.axis("off")
    fig.tight_layout()
    return fig


ALT_TEXT["ring_allreduce.png"] = (
    "Ring all-reduce on 3 ranks, each tensor cut into chunks a, b and c. In two "
    "reduce-scatter steps every rank sends one chunk to its right neighbour, which adds it "
    "in; in two all-gather steps the finished sums travel on until every rank holds all."
)
DIAGRAMS["ring_allreduce.png"] = ring_allreduce


def cluster_two_hosts():
    """Lesson 32's cluster: two network namespaces on one machine, joined by a bridge,
    with Slurm's daemons, the torchrun agents, the ranks and the rendezvous endpoint."""
    fig, ax = plt.subplots(figsize=(10.5, 5.4))
    _box(ax, 0, 0, 10.6, 5.5, "#f3f3f3")
    ax.text(0.15, 5.2, "this Linux machine (root), set up by tools/cluster.py", fontsize=10,
            weight="bold", va="center")
    w = 4.1
    for name, address, x0, ranks, head in [("nodeA", "10.77.0.1", 0.25, (0, 1), True),
                                           ("nodeB", "10.77.0.2", 6.25, (2, 3), False)]:
        _box(ax, x0, 1.55, w, 3.4, "#eef3fb")
        ax.text(x0 + 0.15, 4.7, f"host {name}  (network namespace)", fontsize=10.5,
                weight="bold", va="center")
        ax.text(x0 + 0.15, 4.35, f"/etc/hosts: 127.0.1.1 {name}", fontsize=8,
                family="monospace", va="center", color="#555555")
        slurm_x, agent_x = (x0 + 0.15, x0 + 2.1) if head else (x0 + 2.25, x0 + 0.15)
        _box(ax, slurm_x, 3.3, 1.7, 0.75, "#fff2cc",
             "slurmctld\n+ slurmd" if head else "slurmd", size=8.5)
        agent = ("torchrun agent:\nhosts the rendezvous\nstore nodeA:29500" if head
                 else "torchrun agent:\nclient of\nnodeA:29500")
        _box(ax, agent_x, 3.2, 1.85, 0.95, "#d9ead3", agent, size=8)
        for i, rank in enumerate(ranks):
            _box(ax, x0 + 0.25 + i * 2.0, 2.2, 1.6, 0.7, "#ffffff",
                 f"rank {rank}\nlocal rank {i}", size=8.5)
        _box(ax, x0 + w / 2 - 0.85, 1.35, 1.7, 0.45, "#cfe2f3", f"eth0 {address}", size=8.5,
             weight="bold")
        ax.plot([x0 + w / 2, x0 + w / 2], [1.35, 0.85], color="#555555", lw=2)
    _box(ax, 2.3, 0.35, 6.0, 0.5, "#cccccc", "bridge (the network's switch)", size=9)
    ax.annotate("", xy=(4.0, 3.68), xytext=(6.4, 3.68),
                arrowprops=dict(arrowstyle="->", color="#38761d", lw=1.6, ls="--"))
    ax.text(5.3, 3.85, "rendezvous\n(c10d)", ha="center", va="bottom", fontsize=8,
            color="#38761d")
    ax.annotate("", xy=(6.5, 2.55), xytext=(4.1, 2.55),
                arrowprops=dict(arrowstyle="<->", color="#cc0000", lw=1.4))
    ax.text(5.3, 2.4, "Gloo: every\nrank to every\nother, over\neth0", ha="center",
            va="top", fontsize=8, color="#cc0000")
    ax.set_xlim(-0.1, 10.7)
    ax.set_ylim(-0.1, 5.6)
    ax.axis("off")
    fig.tight_layout()
    return fig


DIAGRAMS["cluster_two_hosts.png"] = cluster_two_hosts
ALT_TEXT["cluster_two_hosts.png"] = (
    "Two hosts on one Linux machine, joined by a bridge. nodeA, 10.77.0.1: slurmctld, "
    "slurmd, the torchrun agent hosting the rendezvous store nodeA:29500, ranks 0 and 1. "
    "nodeB, 10.77.0.2: slurmd, an agent connecting to nodeA:29500, ranks 2 and 3. Gloo "
    "links every rank to every other over eth0."
)


def gpipe_schedule(stages: int = 2, micro_batches: int = 4):
    """The GPipe schedule (lesson 31): one row per stage, time on the x axis; a micro-batch's
    forward (F) or backward (B) takes one slot per stage, idle slots (the bubble) hatched.
    Above, the same batch whole (M = 1): its slots are M times as long."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.9))
    end = 2 * stages * micro_batches
    for ax, m in zip(axes, (1, micro_batches)):
        w = micro_batches / m  # a slot's length, in micro-batch slots
        slots = 2 * (m + stages - 1)
        for s in range(stages):
            y = stages - 1 - s
            busy = set()
            for i in range(m):
                f, b = i + s, (m + stages - 1) + i + (stages - 1 - s)
                busy |= {f, b}
                label = f"{i + 1}" if m > 1 else " (whole batch)"
                _box(ax, f * w + 0.04, y + 0.1, w - 0.08, 0.8, "#9fc5e8", "F" + label, size=9)
                _box(ax, b * w + 0.04, y + 0.1, w - 0.08, 0.8, "#f9cb9c", "B" + label, size=9)
            for t in range(slots):
                if t not in busy:
                    ax.add_patch(plt.Rectangle((t * w + 0.04, y + 0.1), w - 0.08, 0.8,
                                               hatch="///", facecolor="#eeeeee",
                                               edgecolor="#999999"))
        ax.set_yticks([stages - 1 - s + 0.5 for s in range(stages)],
                      [f"stage {s}" for s in range(stages)])
        ax.set_xticks(range(0, end + 1))
        ax.set_xlim(-0.1, end + 0.1)
        ax.set_ylim(0, stages)
        ax.tick_params(length=0)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.set_title(f"M = {m}: each stage idle (hatched) in {2 * (stages - 1)} of "
                     f"{slots} slots, bubble (S-1)/(M+S-1) = "
                     f"{(stages - 1) / (m + stages - 1):.0%}; the step takes "
                     f"{slots * w:g} units", fontsize=10, loc="left")
    axes[1].set_xlabel(f"time, in units of one micro-batch's forward or backward on one "
                       f"stage (S = {stages} stages)")
    fig.tight_layout()
    return fig


DIAGRAMS["gpipe_schedule.png"] = gpipe_schedule
ALT_TEXT["gpipe_schedule.png"] = (
    "GPipe on 2 stages. With the batch whole, each stage is idle half the step (16 units). "
    "With 4 micro-batches, stage 0 runs forwards F1 to F4 while stage 1 follows one slot "
    "behind, then the backwards B1 to B4 run the other way; each stage is idle in 2 of 10 "
    "slots, a bubble of 20%, and the step takes 10 units."
)


def global_batch(ranks: int = 2, accumulate: int = 2, micro: int = 6):
    """The capstone's step (lesson 40): the global batch dealt out to the ranks, each rank's
    share cut into micro-batches; backward under no_sync for all but the last, whose
    backward exchanges the gradients; then the same clipped step everywhere."""
    fig, ax = plt.subplots(figsize=(10, 1.5 + 1.35 * ranks))
    total = ranks * accumulate * micro
    lane_h, x0, w, gap = 1.05, 2.5, 1.65, 1.5
    span = (ranks - 1) * (lane_h + 0.35) + lane_h
    _box(ax, 0, span / 2 - 0.65, 1.9, 1.3, "#fff2cc",
         f"global batch\n{total} windows\n= {micro} x {accumulate} x {ranks}", size=9.5,
         weight="bold")
    after = x0 + 0.1 + accumulate * (w + 0.15)  # where the last micro-batch ends
    right = after + gap
    for rank in range(ranks):
        y = (ranks - 1 - rank) * (lane_h + 0.35)
        ax.annotate("", xy=(x0 - 0.05, y + lane_h / 2), xytext=(1.9, span / 2),
                    arrowprops=dict(arrowstyle="->", color="#555555", lw=1.1))
        _box(ax, x0 - 0.05, y, right + 1.9 - x0, lane_h, "#eef3fb")
        ax.text(x0 + 0.05, y + lane_h - 0.15, f"rank {rank}", fontsize=9.5, weight="bold",
                va="center")
        for k in range(accumulate):
            last = k == accumulate - 1
            _box(ax, x0 + 0.1 + k * (w + 0.15), y + 0.1, w, 0.62,
                 "#d9ead3" if not last else "#c9daf8",
                 f"micro-batch {k + 1}: {micro}\n" + ("backward under no_sync" if not last
                                                      else "backward, all-reduce"),
                 size=8)
        _box(ax, right, y + 0.1, 1.75, 0.62, "#ffffff", "clip, then\noptimizer step", size=8.5)
    xa = after + 0.35
    ax.annotate("", xy=(xa, 0.3), xytext=(xa, span - 0.3),
                arrowprops=dict(arrowstyle="<->", color="#cc0000", lw=1.6))
    ax.text(xa + 0.1, span / 2, "gradients\nexchanged,\nonce a step", color="#cc0000",
            fontsize=8.5, va="center")
    ax.text(0, -0.45, "Every rank divides its summed loss by the tokens of the whole global "
            "batch (an all-reduce of the counts): the step is one process's step.",
            fontsize=9.5)
    ax.set_xlim(-0.1, right + 1.95)
    ax.set_ylim(-0.7, span + 0.1)
    ax.axis("off")
    fig.tight_layout()
    return fig


DIAGRAMS["global_batch.png"] = global_batch
ALT_TEXT["global_batch.png"] = (
    "A step on 2 ranks: 24 windows = 6 per micro-batch x 2 micro-batches x 2 ranks. Each "
    "rank's first backward runs under no_sync, its second exchanges the gradients; then each "
    "clips and takes the same optimizer step."
)


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
