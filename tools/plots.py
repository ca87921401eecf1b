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
                       label=("until its gradients are ready (work, or a wait in forward)"
                              if rank == 0 else None))
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


def join_times(runs: dict, timeout: float | None = None):
    """Rank 0's time to join the group, one bar per init method tried ({launch label:
    the run's "attempts"}); a failed attempt in red, with the timeout it was given."""
    rows = [(f"{label}: {a['method']}", a) for label, attempts in runs.items()
            for a in attempts]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.3))
    labels = [name for name, _ in rows]
    seconds = [a["seconds"] for _, a in rows]
    colors = ["#3366aa" if a["ok"] else "#cc4125" for _, a in rows]
    bars = ax.barh(labels, seconds, color=colors)
    for bar, (_, a) in zip(bars, rows):
        note = "joined" if a["ok"] else "failed: " + a.get("error", "").split(":")[0]
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                f"  {a['seconds']:.2f} s, {note}", va="center", fontsize=9)
    if timeout is not None:
        ax.axvline(timeout, color="#cc4125", ls=":", lw=1)
        ax.text(timeout, 1.0, f" timeout {timeout:g} s", color="#cc4125", fontsize=8,
                va="bottom", transform=ax.get_xaxis_transform())
    ax.invert_yaxis()
    ax.set_xlim(0, max(seconds) * 1.6)
    ax.set_xlabel("seconds rank 0 spent in init_process_group (and its store)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# Lessons 23 and 24's events (23's script's log and 24's store trap): marker, colour, legend label.
EVENT_STYLE = {"start": ("o", "#777777", "process started"),
               "joined": ("^", "#38761d", "joined the group"),
               "resumed": ("s", "#3366aa", "loaded a checkpoint"),
               "first step done": ("D", "#674ea7", "first step of the attempt"),
               "saved": ("|", "#000000", "checkpoint saved (its step)"),
               "kill": ("X", "#cc0000", "SIGKILL"),
               "finished": ("*", "#e69138", "trained the last step")}


def restart_timeline(events: list, notes: dict | None = None):
    """What each rank of each torchrun attempt did, from lesson 23's events log (one
    dict per line: event, rank, restart, time): one row per attempt and rank, a marker
    per event; `notes` ({(restart, rank): text}) are written at the end of a row (by
    default, "never joined the group" on a row without a "joined" event)."""
    t0 = min(e["time"] for e in events)
    rows = sorted({(e["restart"], e["rank"]) for e in events})
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.6))
    seen = set()
    for y, (restart, rank) in enumerate(rows):
        mine = sorted((e for e in events if (e["restart"], e["rank"]) == (restart, rank)),
                      key=lambda e: e["time"])
        times = [e["time"] - t0 for e in mine]
        ax.plot([times[0], max(times[-1], times[0] + 0.05)], [y, y], color="#bbbbbb", lw=6,
                solid_capstyle="butt", zorder=1)
        for e, t in zip(mine, times):
            marker, color, label = EVENT_STYLE.get(e["event"], ("o", "#000000", e["event"]))
            ax.scatter([t], [y], marker=marker, color=color, s=70, zorder=3,
                       label=None if e["event"] in seen else label)
            seen.add(e["event"])
            old = e.get("addresses_in_store")
            if e["event"] == "start" and old:
                ax.text(t, y + 0.28, f"store already holds {len(old)} address key(s)",
                        fontsize=8, ha="center", color="#555555")
        note = (notes or {}).get((restart, rank))
        if note is None and not any(e["event"] == "joined" for e in mine):
            note = "never joined the group"
        if note:
            ax.text(times[-1] + 0.15, y, note, va="center", fontsize=8.5, color="#cc0000")
    ax.set_yticks(range(len(rows)), [f"attempt {r}, rank {k}" for r, k in rows])
    ax.set_ylim(len(rows) - 0.4, -0.7)
    ax.set_xlim(-0.3, max(e["time"] for e in events) - t0 + 4.5)
    ax.set_xlabel("seconds since the first process started")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(seen), fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def resume_curves(data: dict, variants: tuple[str, ...] = ("no_optimizer_state",
                                                           "no_scheduler_state",
                                                           "no_rng_state", "wrong_epoch")):
    """Lesson 04: the loss (rank 0's) and the learning rate of each step, for the run that
    never stopped and for runs resumed from its checkpoint: the full resume, then resumes
    that left something out. The dotted line is the checkpoint."""
    resume, stop_at, steps = data["resume"], data["stop_at"], data["steps"]
    after = list(range(stop_at + 1, steps + 1))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.plot(range(1, steps + 1), resume["losses"]["uninterrupted"], "-", color="#999999",
              lw=5, alpha=0.6, label="uninterrupted")
    right.plot(after, resume["lrs"]["uninterrupted"], "-", color="#999999", lw=5, alpha=0.6,
               label="uninterrupted")
    for name, style in zip(tuple(variants) + ("full",), ["x--", "s:", "^-.", "d--", "o"]):
        label = "resumed, full state" if name == "full" else f"resumed, {name}"
        color, z = ("#1a73e8", 3) if name == "full" else (None, 2)
        for ax, values in ((left, resume["losses"][name]), (right, resume["lrs"][name])):
            ax.plot(after, values, style, color=color, label=label, ms=6, zorder=z)
    for ax in (left, right):
        ax.axvline(stop_at + 0.5, color="#333333", ls=":", lw=1)
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
    left.text(stop_at + 0.6, max(resume["losses"]["uninterrupted"]), "checkpoint",
              va="top", fontsize=9)
    left.set_xlim(0.5, steps + 0.5)
    left.set_ylabel("loss (rank 0's batch)")
    left.set_title("loss: the full resume lies on the uninterrupted run")
    right.set_ylabel("learning rate")
    right.set_ylim(0, None)
    right.set_title("learning rate after the checkpoint")
    right.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def failure_times(cases: list[dict]):
    """How long each start-up failure took to say so: one bar per case ({"label",
    "seconds", "timeout" (None for none), "message"}), the timeout marked, the message's
    first words beside the bar."""
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(cases) + 1.2))
    labels = [c["label"] for c in cases]
    seconds = [c["seconds"] for c in cases]
    ax.barh(labels, seconds, color="#c0504d", height=0.55)
    for y, case in enumerate(cases):
        if case.get("timeout") is not None:
            ax.plot([case["timeout"]] * 2, [y - 0.38, y + 0.38], color="black", lw=2,
                    label="the timeout asked for" if y == 0 else None)
        message = case["message"]
        if len(message) > 56:
            message = message[:56].rsplit(" ", 1)[0] + " ..."
        right = max(case["seconds"], case.get("timeout") or 0)  # clear of the bar and mark
        ax.text(right, y, f"  {case['seconds']:.1f} s: {message}", va="center", fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the attempt to join until the error")
    ax.set_xlim(0, max(seconds + [1]) * 2.6)
    ax.grid(True, axis="x", alpha=0.3)
    if any(c.get("timeout") is not None for c in cases):
        ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    return fig


def fault_timeline(events: list):
    """Lesson 23: what every rank of every torchrun attempt did, from the run's events log
    (dicts with event, rank, restart, time, and step where there is one): one panel per
    attempt (the restart between them takes far longer than the training), one row per
    rank; a rank's bar runs from its start to its kill or its finish."""
    t0 = min(e["time"] for e in events)
    attempts = sorted({e["restart"] for e in events})
    ranks = sorted({e["rank"] for e in events})
    fig, axes = plt.subplots(1, len(attempts), figsize=(11, 0.7 * len(ranks) + 2.2),
                             sharey=True, squeeze=False)
    axes = axes[0]
    kills = [e for e in events if e["event"] == "kill"]
    for ax, attempt in zip(axes, attempts):
        mine = [e for e in events if e["restart"] == attempt]
        first, last = min(e["time"] for e in mine) - t0, max(e["time"] for e in mine) - t0
        pad = 0.12 * max(last - first, 0.05)
        for rank in ranks:
            row = sorted((e for e in mine if e["rank"] == rank), key=lambda e: e["time"])
            if not row:
                continue
            t = [e["time"] - t0 for e in row]
            joined = next((x for e, x in zip(row, t) if e["event"] == "joined"), t[0])
            ax.plot([t[0], joined], [rank, rank], color="#cccccc", lw=8, solid_capstyle="butt")
            ax.plot([joined, t[-1]], [rank, rank], color="#9fc5e8", lw=8, solid_capstyle="butt")
            if row[-1]["event"] not in ("kill", "finished"):  # stopped from outside
                ax.plot([t[-1], last + pad], [rank, rank], color="#9fc5e8", lw=8, ls=":",
                        solid_capstyle="butt")
                ax.text(last + pad, rank + 0.3, "stopped by torchrun (SIGTERM)",
                        ha="right", fontsize=8, color="#555555")
            for e, x in zip(row, t):
                marker, color, _ = EVENT_STYLE.get(e["event"], ("o", "#000000", e["event"]))
                ax.scatter([x], [rank], marker=marker, color=color, s=90 if marker != "|"
                           else 260, zorder=3, linewidths=2)
                if e["event"] == "saved":  # labels alternate in height: saves come fast
                    ax.text(x, rank - 0.25 - 0.17 * (e["step"] // 2 % 2), str(e["step"]),
                            ha="center", fontsize=7)
                elif e["event"] == "kill":
                    ax.text(x, rank + 0.35, f"killed after step {e['step']}", ha="center",
                            fontsize=8.5, color="#cc0000")
                elif e["event"] == "resumed":
                    # left of its marker: the steps and the finish crowd the right
                    ax.text(x, rank + 0.35, f"resumed at step {e['step']} ", ha="right",
                            fontsize=8.5, color="#3366aa")
                elif e["event"] == "finished":
                    ax.text(x, rank + 0.35, f" step {e['step']}", ha="left", fontsize=8.5)
        title = f"attempt {attempt}"
        if attempt > 0 and kills:
            gap = first - (max(k["time"] for k in kills if k["restart"] < attempt) - t0)
            title += f": started {gap:.1f} s after the kill"
        ax.set_title(title, fontsize=10)
        ax.set_xlim(first - pad, last + 2 * pad)
        ax.set_xlabel("seconds since the first process started")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(ranks, [f"rank {r}" for r in ranks])
    axes[0].set_ylim(len(ranks) - 0.4, -0.7)
    handles = [plt.Line2D([], [], marker=m, color=c, ls="", ms=8, label=label, mew=2)
               for m, c, label in EVENT_STYLE.values()]
    handles += [plt.Line2D([], [], color=c, lw=8, label=label) for c, label in
                (("#cccccc", "starting"), ("#9fc5e8", "training"))]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    return fig


def bucket_gantt(ranks: list):
    """DDP's buckets overlapping backward (lesson 13), one row per rank: backward as a grey
    bar, a tick when each parameter's gradient is ready (coloured as its bucket), and each
    bucket's all-reduce as a bar from hand-over to return; ms since a barrier all ranks
    left together. `ranks`: per rank, one step of record_buckets in
    ddp_scripts/13_inside_ddp/buckets.py."""
    n = len(ranks)
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(10, 0.9 * n + 1.7))
    for rank, step in enumerate(ranks):
        y, offset = n - 1 - rank, step["backward_from_barrier"]

        def ms(t, offset=offset):
            return 1e3 * (offset + t)
        ax.broken_barh([(ms(0), 1e3 * step["backward_seconds"])], (y - 0.42, 0.84),
                       facecolor="#e4e4e4", label="backward" if rank == 0 else None)
        lane = 0.44 / max(1, len(step["buckets"]))  # one lane per bucket, under the ticks
        for k, b in enumerate(step["buckets"]):
            color = colors[b["bucket"] % len(colors)]
            ax.broken_barh([(ms(b["at"]), 1e3 * (b["done"] - b["at"]))],
                           (y - 0.38 + k * lane, lane * 0.9), facecolor=color,
                           edgecolor="black", linewidth=0.5,
                           label=f"bucket {b['bucket']}: all-reduce" if rank == 0 else None)
            ax.vlines([ms(step["grad_ready"][p]) for p in b["params"]], y + 0.06, y + 0.38,
                      color=color, linewidth=1.5)
    ax.vlines([], 0, 0, color="black", linewidth=1.5, label="a gradient ready (tick)")
    ax.set_yticks(range(n), [f"rank {r}" for r in reversed(range(n))])
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("milliseconds since a barrier all ranks left together")
    ax.set_title("One DDP step: each bucket's all-reduce starts while backward still runs")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=4, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def memory_per_rank(ranks: list, ways: tuple[str, ...] = ("DDP", "ZeRO", "FSDP2")):
    """What each rank keeps under DDP, ZeRO and FSDP2 (lesson 30), as stacked bars: one bar
    per rank and way, weights, gradients and optimizer state stacked, in KiB. `ranks`: per
    rank, what ddp_scripts/30_beyond_allreduce/sharding.py found ({way: {"params",
    "grads", "optimizer"}} in bytes, a shard counted as its own size)."""
    parts = (("params", "weights", "#4f81bd"), ("grads", "gradients", "#9bbb59"),
             ("optimizer", "optimizer state (Adam)", "#f79646"))
    n = len(ranks)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for rank, found in enumerate(ranks):
        xs = [i - 0.4 + width * (rank + 0.5) for i in range(len(ways))]
        bottom = [0.0] * len(ways)
        for key, label, color in parts:
            kib = [found[way][key] / 1024 for way in ways]
            ax.bar(xs, kib, width * 0.9, bottom=bottom, color=color, edgecolor="white",
                   label=label if rank == 0 else None)
            bottom = [b + k for b, k in zip(bottom, kib)]
        for x, total in zip(xs, bottom):
            ax.text(x, total, f"r{rank}\n{total:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(ways)), ways)
    ax.set_ylabel("KiB kept by one rank")
    ax.set_ylim(0, 1.2 * max(sum(f[w][k] for k in ("params", "grads", "optimizer"))
                             for f in ranks for w in ways) / 1024)
    ax.set_title(f"Memory per rank, {n} ranks (r0, r1, ...): sharding divides what it shards")
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def accumulation_plot(acc: dict, micro_steps: int):
    """Lesson 05: one optimizer step's gradient from the same samples, four ways (rank 0's
    "accumulation" findings): the buckets each way all-reduced, and each gradient entry
    against the one big batch's (on the diagonal: the same gradient)."""
    ways = ["one big batch", "no_sync", "sync every micro-step", "no_sync, no division"]
    colors = ["#999999", "#1a73e8", "#e69138", "#cc0000"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9),
                                      gridspec_kw={"width_ratios": [1, 1.25]})
    counts = [acc[w]["allreduces"] for w in ways]
    left.barh(ways, counts, color=colors)
    for y, n in enumerate(counts):
        left.text(n, y, f" {n}", va="center", fontsize=9)
    left.invert_yaxis()
    left.set_xlim(0, max(counts) * 1.25)
    left.set_xlabel("buckets all-reduced for one optimizer step")
    left.set_title("communication")
    left.grid(True, axis="x", alpha=0.3)
    big = acc["one big batch"]["grad"]
    lo, hi = min(big), max(big)
    right.plot([lo, hi], [lo, hi], color="#999999", lw=1, label="the big batch's gradient")
    right.plot([lo, hi], [micro_steps * lo, micro_steps * hi], color="#cc0000", lw=1, ls=":",
               label=f"{micro_steps} × the big batch's gradient")
    for way, color, marker in zip(ways[1:], colors[1:], ["o", "x", "s"]):
        if marker == "x":
            right.scatter(big, acc[way]["grad"], s=30, marker=marker, color=color, label=way,
                          zorder=3)
        else:
            right.scatter(big, acc[way]["grad"], s=22, marker=marker, facecolors="none",
                          edgecolors=color, label=way, zorder=3)
    right.set_xlabel("gradient entry, one big batch")
    right.set_ylabel("the same entry, accumulated")
    right.set_title("gradient: every entry, every way")
    right.legend(fontsize=8, loc="upper left")
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def pipeline_timeline(ranks: list):
    """One pipeline step as it ran (lesson 31): one row per rank, a box for each
    micro-batch's forward (F) and backward (B) on that rank's stage, in ms since a barrier
    all ranks left together. `ranks`: per rank, {"rank", "stage", "replica", "events":
    [[kind, start, end],
     ...]} (seconds), as ddp_scripts/31_pipeline_ddp/pipelining.py records them."""
    colors = {"F": "#9fc5e8", "B": "#f9cb9c"}
    n = len(ranks)
    fig, ax = plt.subplots(figsize=(10, 0.7 * n + 1.5))
    span = 1e3 * max(end for found in ranks for _, _, end in found["events"])
    for row, found in enumerate(ranks):
        y = n - 1 - row
        number = {"F": 0, "B": 0}
        for kind, start, end in found["events"]:
            number[kind] += 1
            width = max(1e3 * (end - start), 0.02)
            ax.broken_barh([(1e3 * start, width)], (y - 0.38, 0.76), facecolor=colors[kind],
                           edgecolor="#333333", linewidth=0.6)
            if width > 0.012 * span:  # a label only where it fits
                ax.text(1e3 * start + width / 2, y, f"{kind}{number[kind]}", ha="center",
                        va="center", fontsize=6)
    ax.set_yticks(range(n), [f"rank {f['rank']}: stage {f['stage']}, replica {f['replica']}"
                             for f in reversed(ranks)])
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("milliseconds since a barrier all ranks left together")
    ax.set_title("One GPipe step as it ran: forwards (F, blue) then backwards (B, orange); "
                 "gaps are idle time", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def resume_variants(data: dict):
    """Lesson 04: every resume of the lesson's table against the run that never stopped,
    one panel each: rank 0's loss at each step after the checkpoint (dots) on the
    uninterrupted run's (grey), and in the title the largest difference of the final
    weights. The dotted line is the checkpoint."""
    resume, stop_at, steps = data["resume"], data["stop_at"], data["steps"]
    names = [name for name in resume["losses"] if name != "uninterrupted"]
    columns = 4
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(12, 2.5 * rows + 0.4), sharex=True,
                             sharey=True, squeeze=False)
    after = list(range(stop_at + 1, steps + 1))
    for ax, name in zip(axes.flat, names):
        ax.plot(range(1, steps + 1), resume["losses"]["uninterrupted"], "-", color="#999999",
                lw=5, alpha=0.6)
        ax.plot(after, resume["losses"][name], "o-", ms=4, lw=1,
                color="#1a73e8" if name == "full" else "#c0504d")
        ax.axvline(stop_at + 0.5, color="#333333", ls=":", lw=1)
        ax.set_title(f"{name}: {resume[name]['max_abs_diff']:.2g}", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (rank 0)")
    fig.suptitle("each resume (dots) against the uninterrupted run (grey); title: variant, "
                 "largest weight difference at the end", fontsize=10)
    fig.tight_layout()
    return fig


def cut_files(cuts: list):
    """Lesson 22, part 2: what torch.load said about a checkpoint cut short, from the run's
    list of cuts (dicts with cut, bytes, of and error): one row per cut, a bar to where the
    file ends (bytes kept, on a symmetric log scale, the whole file as a line), coloured by
    the error it gave."""
    def kind(error):
        first = error.splitlines()[0] if error else "loaded"
        if "failed finding central directory" in first:
            return "failed finding central directory"
        if "not a ZIP archive" in first:
            return "not a ZIP archive"
        name, _, said = first.partition(":")
        said = said.strip().split(".")[0]  # its first sentence
        return f"{name} ({said})" if said else f"{name} (no message)"
    kinds = list(dict.fromkeys(kind(c["error"]) for c in cuts))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(cuts) + 1.8))
    for y, cut in enumerate(cuts):
        k = kind(cut["error"])
        ax.barh(y, cut["bytes"], color=colors[kinds.index(k) % len(colors)],
                label=k if k not in [kind(c["error"]) for c in cuts[:y]] else None)
        ax.plot([cut["of"], cut["of"]], [y - 0.4, y + 0.4], color="#333333", lw=1)
        ax.text(cut["bytes"] * 1.15 + 1, y, f"{cut['bytes']:,} of {cut['of']:,}",
                va="center", fontsize=8)
    ax.set_xscale("symlog", linthresh=1)
    ax.set_yticks(range(len(cuts)), [c["cut"] for c in cuts])
    ax.invert_yaxis()
    ax.set_xlabel("bytes left in the file (a black tick: the whole file)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 1.2 / (len(cuts) + 4)),
              ncol=2, fontsize=8.5, title="what torch.load raised")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def gpt_curves(curves: dict, speeds: dict | None = None, baseline: str | None = None):
    """The capstone's runs (lesson 40): training loss per step, one line per run
    ({label: losses}); and, when given, tokens trained per second ({label: tokens/s}),
    each bar labelled with its speed-up over `baseline`."""
    if speeds:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6),
                                          gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, left = plt.subplots(figsize=(8, 3.6))
    for (label, losses), style in zip(curves.items(), ["-", "--", ":", "-."]):
        left.plot(range(1, len(losses) + 1), losses, style, label=label, lw=1.3)
    left.set_xlabel("optimizer step")
    left.set_ylabel("training loss (nats per character)")
    left.set_ylim(top=min(5.0, left.get_ylim()[1]))
    left.grid(True, alpha=0.3)
    left.legend()
    if speeds:
        labels, values = list(speeds), list(speeds.values())
        bars = right.barh(labels, values, color=["#999999", "#1a73e8", "#e69138"][:len(values)])
        for bar, value in zip(bars, values):
            note = f" ({value / speeds[baseline]:.2f}x)" if baseline else ""
            right.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                       f"  {value:,.0f}/s{note}", va="center", fontsize=9)
        right.invert_yaxis()
        right.set_xlabel("tokens trained per second")
        right.set_xlim(0, max(values) * 1.5)
        right.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def window_lengths(lengths: list, context: int):
    """How many characters the capstone's training windows hold (lesson 40): a bar per
    length, the full windows at `context` + 1 on the right."""
    fig, ax = plt.subplots(figsize=(8, 2.8))
    counts = [lengths.count(n) for n in range(context + 2)]
    ax.bar(range(context + 2), counts, color=["#1a73e8"] * (context + 1) + ["#999999"])
    ax.set_yscale("log")
    ax.set_xlabel(f"characters in a window (at most {context + 1}: {context} to predict)")
    ax.set_ylabel("training windows")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def flight_recorder_timeline(traces: dict, last: int = 8):
    """Lesson 25: each rank's last `last` collectives from its flight recorder
    ({rank: unpickled dump}), one box per collective at its sequence number, labelled
    with its name; the first sequence number where the ranks disagree is drawn in red.
    The title says how many of the sequence numbers it shows."""
    calls = {rank: {e["collective_seq_id"]: e["profiling_name"].split(":")[-1]
                    for e in trace["entries"]} for rank, trace in sorted(traces.items())}
    every = sorted(set().union(*calls.values()))
    seqs = every[-last:]
    odd = next((s for s in seqs if len({c.get(s) for c in calls.values()}) > 1), None)
    fig, ax = plt.subplots(figsize=(1.25 * len(seqs) + 1.6, 0.75 * len(calls) + 1.2))
    for y, mine in enumerate(calls.values()):
        for x, seq in enumerate(seqs):
            name = mine.get(seq)
            if name is None:
                continue
            red = seq == odd
            ax.add_patch(plt.Rectangle((x + 0.04, y - 0.35), 0.92, 0.7,
                                       facecolor="#f7c6c6" if red else "#dbe7f6",
                                       edgecolor="#cc0000" if red else "#8899aa",
                                       lw=2 if red else 1))
            ax.text(x + 0.5, y, name, ha="center", va="center", fontsize=8.5,
                    weight="bold" if red else "normal")
        if max(mine, default=0) < seqs[-1]:
            ax.text(len([s for s in seqs if s <= max(mine, default=0)]) + 0.1, y,
                    "(nothing more)", va="center", fontsize=8, color="#777777")
    ax.set_xticks([x + 0.5 for x in range(len(seqs))], [str(s) for s in seqs])
    ax.set_yticks(range(len(calls)), [f"rank {r}" for r in calls])
    ax.set_xlim(0, len(seqs))
    ax.set_ylim(len(calls) - 0.5, -0.6)
    ax.set_xlabel("collective sequence number (flight recorder)")
    shown = f"the last {len(seqs)} of {len(every)}" if len(seqs) < len(every) else "all"
    ax.set_title(f"{shown} collectives per rank"
                 + (f"; first mismatch at {odd}" if odd else ""), fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def slow_link_steps(measured: dict, predicted: dict, rate_mbit: float):
    """Lesson 34: the time of one DDP step under each communication hook, on the fast link
    and on the link limited to `rate_mbit`, as bars (ms), the prediction for the slow link
    marked on its bar. `measured`: {hook: {"fast": s, "slow": s}}; `predicted`: {hook: s}."""
    hooks = list(measured)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for offset, link, label, color in ((-0.2, "fast", "fast link (no limit)", "#9bbb59"),
                                       (0.2, "slow", f"link limited to {rate_mbit:g} Mbit/s",
                                        "#c0504d")):
        ms = [measured[h][link] * 1e3 for h in hooks]
        xs = [i + offset for i in range(len(hooks))]
        ax.bar(xs, ms, 0.38, color=color, label=label)
        for x, value in zip(xs, ms):
            ax.text(x, value, f"{value:.0f}", ha="center", va="bottom", fontsize=9)
    ax.scatter([i + 0.2 for i in range(len(hooks))], [predicted[h] * 1e3 for h in hooks],
               marker="_", s=900, linewidths=2.5, color="black", zorder=3,
               label="predicted (slow link): compute + bytes sent / rate")
    ax.set_xticks(range(len(hooks)), hooks)
    ax.set_ylabel("ms per training step")
    ax.set_ylim(0, 1.2 * max(max(m.values()) for m in measured.values()) * 1e3)
    ax.set_title("One DDP step: the slow link costs what its bytes take; compression wins it back")
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def latency_bandwidth_fit(sizes: list, rounds: list, alpha: float, beta: float,
                          noisy_below: float | None = None):
    """all_reduce time against message size (log-log): every round's time as a faint dot,
    the median of the rounds as a circle, and the fitted line t = alpha + S / beta.
    `rounds`: per message size, the seconds of each round; alpha in s, beta in bytes/s.
    noisy_below: shade the sizes below it (bytes), where noise dominates."""
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if noisy_below:
        ax.axvspan(min(sizes) / 2, noisy_below / 1.4, color="#eeeeee", zorder=0,
                   label=f"below {noisy_below / 1024:g} KiB: all latency, noise dominates")
    for size, seconds in zip(sizes, rounds):
        ax.plot([size] * len(seconds), [1e6 * s for s in seconds], ".", color="#bbbbbb",
                zorder=1)
    medians = [1e6 * float(np.median(seconds)) for seconds in rounds]
    ax.plot(sizes, medians, "o", color="#3366aa", label="median of the rounds", zorder=3)
    line = np.geomspace(min(sizes) / 2, max(sizes) * 2, 100)
    ax.plot(line, 1e6 * (alpha + line / beta), "-", color="#cc5500", zorder=2,
            label=f"fit: {alpha * 1e6:.0f} µs + S / ({beta / 1e9:.2f} GB/s)")
    ax.plot([], [], ".", color="#bbbbbb", label="one round")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size S (bytes)")
    ax.set_ylabel("time per all_reduce (µs)")
    ax.set_title("all_reduce: a fixed latency, then time grows with the bytes")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def step_predictions(rows: list, one_message: float | None = None):
    """One DDP step per bucket_cap_mb: the measured step as a bar, the compute alone as a
    line in it, and the two predictions as markers, side by side so that equal values stay
    visible. `rows`: dicts with cap, buckets, measured, compute, overlap and serial
    (seconds); one_message: compute + one all-reduce of every gradient (s), a dashed line."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x = range(len(rows))
    ax.bar(x, [1e3 * r["measured"] for r in rows], width=0.55, color="#c9d7ee",
           edgecolor="#3366aa", label="measured step (median)")
    ax.hlines([1e3 * r["compute"] for r in rows], [i - 0.3 for i in x], [i + 0.3 for i in x],
              color="black", linestyles=":", label="forward + backward, no DDP")
    if one_message is not None:
        ax.axhline(1e3 * one_message, color="#7b3294", linestyle="--", linewidth=1,
                   label="compute + one all-reduce of every gradient")
    ax.plot([i - 0.12 for i in x], [1e3 * r["overlap"] for r in rows], "v", color="#2a9d4b",
            markersize=10, markeredgecolor="black",
            label="predicted if communication ran beside compute")
    ax.plot([i + 0.12 for i in x], [1e3 * r["serial"] for r in rows], "^", color="#cc5500",
            markersize=10, markeredgecolor="black", label="predicted if nothing overlaps")
    ax.set_xticks(list(x), [f"bucket_cap_mb={r['cap']:g}\n{r['buckets']} bucket(s)"
                            for r in rows])
    ax.set_ylabel("milliseconds per step")
    ax.set_ylim(0, 1.35 * max(1e3 * max(r["measured"], r["serial"]) for r in rows))
    ax.set_title("A DDP step against two predictions")
    ax.legend(fontsize=8.5, loc="upper right", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _gaps(a: list, b: list, floor: float) -> list:
    return [max(abs(x - y), floor) for x, y in zip(a, b)]


def _loss_and_gap(fig, left, right, floor: float):
    """The axes of a loss panel (left) and a log-scale distance panel (right)."""
    left.set_ylabel("training loss (global batch)")
    right.set_ylabel(f"|difference in loss| (exact: {floor:g})")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    right.set_yscale("log")
    right.set_ylim(floor / 2, 1)
    fig.tight_layout()
    return fig


def same_training(losses: dict, floor: float = 1e-9):
    """Left: the training loss per step at each world size ({ranks: [loss per step]}).
    Right: each world size's distance from one process's loss, per step (log scale; an
    exact match is drawn at `floor`)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    one = losses[min(losses)]
    for (ranks, curve), style in zip(sorted(losses.items()), ["-", "--", "-.", ":"]):
        steps = range(1, len(curve) + 1)
        left.plot(steps, curve, style, label=f"{ranks} rank(s)")
        if ranks != min(losses):
            right.plot(steps, _gaps(curve, one, floor), style, label=f"{ranks} ranks vs 1")
    return _loss_and_gap(fig, left, right, floor)


def restart_match(uninterrupted: list, restarted: list, from_step: int,
                  floor: float = 1e-9):
    """Left: the loss per step of an uninterrupted run and of a run restarted from the
    checkpoint of `from_step` (dotted line). Right: their distance per step (log scale; an
    exact match is drawn at `floor`)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    steps = range(1, len(uninterrupted) + 1)
    left.plot(steps, uninterrupted, "-", lw=3, alpha=0.5, label="uninterrupted")
    left.plot(range(1, len(restarted) + 1), restarted, "k--", label="killed, restarted")
    right.plot(steps, _gaps(restarted, uninterrupted, floor), "k-",
               label="restarted vs uninterrupted")
    for ax in (left, right):
        ax.axvline(from_step, color="#999999", lw=0.8, ls=":")
    return _loss_and_gap(fig, left, right, floor)


def elastic_timeline(entries: list, plain: dict, events: dict):
    """Lesson 26: an elastic job whose host died, came back and lost its link. Top: each
    world's training as a bar at its size over wall-clock seconds, the time between two
    worlds (no step trained) shaded with its length, the events marked; bottom: the loss
    per global step against the uninterrupted job's. `entries`: the job's log (JSON
    lines: "start" events and steps, with "time"); `plain`: {step: loss} of the
    uninterrupted job; `events`: {label: seconds since the start}."""
    t0 = entries[0]["time"]
    worlds, current = [], None
    for e in entries:
        if e.get("event"):
            current = {"world": e["world"], "times": [], "steps": []}
            worlds.append(current)
        elif current is not None:
            current["times"].append(e["time"] - t0)
            current["steps"].append(e["step"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.4),
                                      gridspec_kw={"height_ratios": [1, 1.4]})
    for k, w in enumerate(worlds):
        if not w["times"]:
            continue
        top.plot([w["times"][0], w["times"][-1]], [w["world"]] * 2, lw=8, color="#4f81bd",
                 solid_capstyle="butt", label="training (bar height: ranks)" if k == 0 else None)
        top.text(w["times"][0], w["world"] + 0.35, f"steps {w['steps'][0]}-{w['steps'][-1]}",
                 fontsize=8)
        if k + 1 < len(worlds) and worlds[k + 1]["times"]:
            gap = (w["times"][-1], worlds[k + 1]["times"][0])
            top.axvspan(*gap, color="#eeeeee", zorder=0)
            top.text(sum(gap) / 2, 3.0, f"{gap[1] - gap[0]:.1f} s", ha="center", fontsize=8)
    for label, seconds in events.items():
        top.axvline(seconds, color="#c0504d", ls="--", lw=1)
        top.text(seconds, 5.3, label, fontsize=8, color="#c0504d", ha="center")
    top.set_ylim(0, 5.8)
    top.set_yticks([0, 2, 4])
    top.set_xlabel("seconds since the job started (shaded: no step trained)")
    top.set_ylabel("ranks")
    top.legend(loc="lower right", fontsize=8)
    top.grid(True, axis="x", alpha=0.3)
    redone = sum(len(w["steps"]) for w in worlds) - len(plain)
    bottom.plot(sorted(plain), [plain[s] for s in sorted(plain)], color="#9bbb59", lw=4,
                alpha=0.6, label="uninterrupted job (4 ranks throughout)")
    bottom.plot([s for w in worlds for s in w["steps"]],
                [e["loss"] for e in entries if "loss" in e], ".", ms=3, color="#4f81bd",
                label=f"the job above ({redone} steps done twice)")
    bottom.set_xlabel("global step")
    bottom.set_ylabel("training loss")
    bottom.legend(fontsize=9)
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig
