"""Figures the lessons draw from their runs' JSON (plotting code kept out of the lessons)."""

from __future__ import annotations

import matplotlib.pyplot as plt


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "[" + ", ".join(f"{v:g}" for v in value) + "]"
    return f"{value:g}"


def collectives_grid(data: dict, names: list[str]):
    """One row per operation, one column per rank: what the rank held before -> after.

    A dash means the rank holds nothing meaningful (it takes no part, or the result is
    defined on one rank only)."""
    n = data["world_size"]
    fig, ax = plt.subplots(figsize=(2.3 * n + 2.2, 0.62 * len(names) + 0.8))
    for row, name in enumerate(names):
        y = len(names) - 1 - row
        ax.text(-0.1, y, name, ha="right", va="center", fontsize=10, weight="bold",
                family="monospace")
        entry = data["collectives"][name]
        for rank in range(n):
            before, after = _fmt(entry["before"][rank]), _fmt(entry["after"][rank])
            ax.add_patch(plt.Rectangle((rank + 0.03, y - 0.4), 0.94, 0.8,
                                       facecolor="#eef3fb" if row % 2 else "#ffffff",
                                       edgecolor="#999999"))
            ax.text(rank + 0.5, y + 0.13, before, ha="center", va="center", fontsize=8.5,
                    color="#555555")
            ax.text(rank + 0.5, y - 0.19, "-> " + after, ha="center", va="center",
                    fontsize=9, weight="bold")
    for rank in range(n):
        ax.text(rank + 0.5, len(names) - 0.25, f"rank {rank}", ha="center", va="bottom",
                fontsize=10, weight="bold")
    ax.set_xlim(-1.6, n)
    ax.set_ylim(-0.6, len(names) + 0.2)
    ax.axis("off")
    ax.set_title(f"before -> after, world size {n} (backend {data['backend']})", fontsize=11)
    fig.tight_layout()
    return fig


def bandwidth_plot(data: dict):
    """all_reduce time, and algorithm / bus bandwidth, against message size (log axes),
    with one process's memory-copy bandwidth for reference."""
    rows = data["rows"]
    sizes = [r["bytes"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.loglog(sizes, [r["seconds"] * 1e6 for r in rows], "o-", color="#3366aa")
    left.set_xlabel("message size (bytes)")
    left.set_ylabel("time per all_reduce (µs)")
    left.set_title("time: flat while latency dominates, then linear")
    right.loglog(sizes, [r["algbw"] / 1e9 for r in rows], "o-", label="algbw = S / t")
    right.loglog(sizes, [r["busbw"] / 1e9 for r in rows], "s--",
                 label="busbw = algbw x 2(n-1)/n")
    threads = data.get("threads")
    right.loglog(sizes, [r["copy_bandwidth"] / 1e9 for r in rows], ":", color="#999999",
                 label="memory copy, one process" + (f", {threads} thread(s)" if threads else ""))
    right.set_xlabel("message size (bytes)")
    right.set_ylabel("GB/s")
    right.set_title(f"bandwidth, {data['world_size']} ranks, {data['backend']}")
    right.legend(fontsize=9)
    for ax in (left, right):
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def training_curves(runs: dict):
    """Train loss and test accuracy per epoch, one line per run ({label: history})."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for (label, history), style in zip(runs.items(), ["o-", "x--", "s:"]):
        epochs = [h["epoch"] for h in history]
        left.plot(epochs, [h["train_loss"] for h in history], style, label=label)
        right.plot(epochs, [h["reduced"] for h in history], style, label=label)
    left.set_xlabel("epoch")
    left.set_ylabel("train loss (mean over all ranks' samples)")
    left.set_yscale("log")
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy")
    right.axhline(0.95, color="#999999", lw=0.8, ls=":")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def straggler_timeline(data: dict):
    """One row per rank, one pair of bars per step: working (start to gradients ready)
    and waiting (gradients ready to all-reduce done)."""
    timelines = data["timeline"]
    n = len(timelines)
    fig, ax = plt.subplots(figsize=(11, 0.7 * n + 1.4))
    for rank, steps in enumerate(timelines):
        y = n - 1 - rank
        work = [(s["start"], s["ready"] - s["start"]) for s in steps]
        wait = [(s["ready"], s["end"] - s["ready"]) for s in steps]
        ax.broken_barh(work, (y - 0.3, 0.6), facecolor="#3366aa", edgecolor="white",
                       label="working (gradients not ready yet)" if rank == 0 else None)
        ax.broken_barh(wait, (y - 0.3, 0.6), facecolor="#f0a030", edgecolor="white",
                       label="waiting in the gradient all-reduce" if rank == 0 else None)
    slow = data["slow_rank"]
    ax.set_yticks(range(n), [f"rank {r}" + (" (slow)" if r == slow else "")
                             for r in reversed(range(n))])
    ax.set_xlabel("seconds since the common start (a barrier)")
    ax.set_title(f"{data['steps']} DDP steps; rank {slow} sleeps {data['delay']:g} s "
                 f"in each step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def speed_bars(runs: dict, baseline: str):
    """Samples trained per second, one bar per run ({label: samples per second}), each
    labelled with its speed-up over the `baseline` run."""
    fig, ax = plt.subplots(figsize=(8, 2.8))
    labels, speeds = list(runs), list(runs.values())
    bars = ax.barh(labels, speeds, color=["#999999", "#1a73e8", "#e69138"][:len(runs)])
    for bar, speed in zip(bars, speeds):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f"  {speed:,.0f} /s  ({speed / runs[baseline]:.2f}x)", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("samples trained per second (more is better)")
    ax.set_xlim(0, max(speeds) * 1.35)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
