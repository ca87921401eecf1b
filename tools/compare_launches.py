"""Run lessons twice, with warm launches and with cold ones (DDP_COURSE_COLD_LAUNCH=1, every
process a new interpreter, as a learner's torchrun), and compare every launch they make:
its command, how it ended (exit status, timed out or not), each rank's lines, torchrun's
own lines and the JSON it wrote, with what depends on timing taken out (numbers, temporary
folders, process ids, torchrun's log-line headers). Prints each difference; exits 1 if
there is one.

    python -m tools.compare_launches [--only 08_] [--repeat 1]

A lesson's numbers (timings, losses that depend on which rank was slow) are masked, so a
difference here is one of shape: a line only one of the two printed, another error, another
exit status, another set of JSON keys.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat

from tools.course import execute, lessons, make_workspace, why_not_here
from tools.launch import LOG
from tools.zygote import OFF

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TEMP = re.compile(r"/tmp/[\w.@-]+(/[\w.@-]+)*")
_HEADER = re.compile(r"^(\[[\w ]+\]:?\s*)?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] ")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_LABEL = re.compile(r"^(\[(node\d+|rank\d+|default\d+)\](:| )\s?)+")
_HEX = re.compile(r"0x[0-9a-f]+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(_\w+)?")
# Lines whose presence depends on timing in any run, warm or cold: Gloo's log of each
# failed connection attempt (how many retries fit), and torchrun's lines about the ranks
# it stopped because another one failed (whether they were still running then).
_TIMING = re.compile(r"debug_logger\.cc.*failed to connect|Sending process # closing signal|"
                     r"\(SIGTERM\)|error_file: <N/A>")
# How Gloo says that a peer died: by its connection being reset or closed (which one
# depends on how far the peer got before it died).
_PEER_GONE = re.compile(r"(Read error \[[^\]]*\]:#: Connection reset by peer|"
                        r"Connection closed by peer \[[^\]]*\]:#)\. This is typically caused "
                        r"by a remote worker (hanging or bugs in the application|crashing)")
# Launches whose failure is, by design, one of several (which one depends on timing; the
# lesson says so): for these, how they ended and their JSON are compared, not their lines.
# 20_rendezvous_failures (a stale file: the dead rank's port refuses, or the connection
# times out) and 24_store_trap (the trap: refused, timed out, or reset, on either rank).
# 32_clusters' second (host B's link goes down: which agent reports first) varies between
# two cold runs alike.
# 23_fault_tolerance's killed rank (--max-restarts): its peer either fails in its
# all-reduce first (a traceback) or is stopped by torchrun before it notices (none).
# 25_debugging's rank0_eval (rank 0 waits in a broadcast, rank 1 in a barrier, each with
# the same timeout, while the lesson runs three hangs at once): rank 0 either times out or
# first sees rank 1 gone, a race of milliseconds; seen both ways in cold runs. A launch is
# named by its number in the lesson or by a part of its command.
VARIES = {("20_rendezvous_failures", 3), ("24_store_trap", 1), ("32_clusters", 2),
          ("23_fault_tolerance", "--max-restarts="), ("25_debugging", "--bug rank0_eval ")}
# Launches where a rank's collective either times out or first sees its peer leave (the
# lesson accepts both): their lines are compared with the two errors read as one.
# 25_debugging's rank0_metric: rank 0 times out in its reduce, writes its dumps and leaves,
# while rank 1 waits in its all-reduce with the same timeout; seen both ways (CI, a warm run).
TIMED_OUT_OR_GONE = {("25_debugging", "--bug rank0_metric ")}
_TIMED_OUT_OR_GONE = re.compile(r"(\[\S+\.cc:#\] )?(Timed out waiting #ms for recv operation "
                                r"to complete|<the peer is gone>|Connection (closed|reset) by "
                                r"peer|Read error).*$")


def normalize(text: str) -> str:
    text = _ANSI.sub("", text)
    text = _TEMP.sub("/tmp/…", text)
    text = _UUID.sub("<uuid>", text)
    text = _HEX.sub("0x…", text)
    text = " ".join(_NUMBER.sub("#", text).split())
    return _PEER_GONE.sub("<the peer is gone>", text)


def shape(launch: dict) -> dict:
    """What of a launch does not depend on timing."""
    ranks: dict[str, list[str]] = {}
    others = []
    # pdb's prompt ends without a newline, so where it lands depends on timing: the next
    # line of the rank (`(Pdb) > file(3)main()`), another rank's (`(Pdb) [default1]:...`),
    # or a line of its own. The prompt is left out; what pdb printed is compared.
    for line in launch["output"].replace("(Pdb) [", "\n[").replace("(Pdb) ", "").splitlines():
        line = _HEADER.sub("", _ANSI.sub("", line))
        label = _LABEL.match(line)
        text = normalize(line[label.end():] if label else line)
        if not text or _TIMING.search(text):
            continue
        if label:
            ranks.setdefault(label.group(0).strip(), []).append(text)
        else:
            others.append(text)
    return {"command": normalize(launch["command"]), "returncode": launch["returncode"],
            "timed_out": launch["timed_out"],
            "ranks": {k: sorted(v) for k, v in sorted(ranks.items())},
            "torchrun": sorted(set(others)), "data": _masked(launch["data"])}


# JSON fields that hold what timing decides: the store keys a process found when it started
# (lesson 24: whether its peers of the same attempt had written theirs yet); and lists whose
# order is the order in which the ranks got there (lesson 23's events, from all ranks).
TIMING_FIELDS = ("addresses_in_store",)
ARRIVAL_ORDER = ("events",)


def _masked(value):
    if isinstance(value, dict):
        return {k: "…" if k in TIMING_FIELDS else
                sorted(map(_masked, v), key=json.dumps) if k in ARRIVAL_ORDER and
                isinstance(v, list) else _masked(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return "#"
    return normalize(str(value))


def _paths_differing(a, b, path="data"):
    """(path, a's value, b's value) for each place where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            yield from _paths_differing(a.get(key, "<missing>"), b.get(key, "<missing>"),
                                        f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _paths_differing(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, str(a)[:200], str(b)[:200]


def named(lesson: str, number: int, command: str, launches: set) -> bool:
    """Whether a launch (the lesson's `number`th, running `command`) is one of `launches`."""
    return (lesson, number) in launches or any(
        name == lesson and isinstance(part, str) and part in command + " "
        for name, part in launches)


def _one_error(shaped: dict) -> dict:
    """A launch's shape with "timed out" and "the peer left" read as one error."""
    def one(lines):
        return sorted({_TIMED_OUT_OR_GONE.sub("<timed out, or saw the peer leave>", line)
                       for line in lines})
    return {**shaped, "ranks": {k: one(v) for k, v in shaped["ranks"].items()},
            "torchrun": one(shaped["torchrun"])}


def differences(lesson: str, warm: list[dict], cold: list[dict]) -> tuple[list[str], list[str]]:
    """(differences, notes): the launches' differences, and the launches the warm run started
    cold (with why)."""
    found, notes = [], []
    if len(warm) != len(cold):
        found.append(f"{len(warm)} launches warm, {len(cold)} cold")
    # Pair them by command (a lesson may run several at once: they end in any order)
    unpaired = list(cold)
    pairs = []
    for w in warm:
        command = normalize(w["command"])
        c = next((c for c in unpaired if normalize(c["command"]) == command), None)
        if c is None:
            found.append(f"no cold launch like {command[:120]}")
            continue
        unpaired.remove(c)
        pairs.append((w, c))
    for i, (w, c) in enumerate(pairs):
        a, b = shape(w), shape(c)
        where = f"launch {i + 1} ({a['command'][:90]})"
        if not w["warm"]:
            notes.append(f"{where}: cold in the warm run too: {w.get('why_cold')}")
        for key in ("command", "returncode", "timed_out"):
            if a[key] != b[key]:
                found.append(f"{where}: {key} differs:\n  warm: {a[key]}\n  cold: {b[key]}")
        found += [f"{where}: its JSON differs at {path}:\n  warm: {x}\n  cold: {y}"
                  for path, x, y in _paths_differing(a["data"], b["data"])][:8]
        if named(lesson, i + 1, w["command"], VARIES):
            continue
        if named(lesson, i + 1, w["command"], TIMED_OUT_OR_GONE):
            a, b = _one_error(a), _one_error(b)
        for rank in sorted(a["ranks"].keys() | b["ranks"].keys()):
            x, y = a["ranks"].get(rank, []), b["ranks"].get(rank, [])
            only_w = [line for line in x if line not in y]
            only_c = [line for line in y if line not in x]
            if only_w or only_c:
                found.append(f"{where}: rank {rank}'s lines differ:\n"
                             + "".join(f"  warm only: {line}\n" for line in only_w[:8])
                             + "".join(f"  cold only: {line}\n" for line in only_c[:8]))
        only_w = [line for line in a["torchrun"] if line not in b["torchrun"]]
        only_c = [line for line in b["torchrun"] if line not in a["torchrun"]]
        if only_w or only_c:
            found.append(f"{where}: torchrun's lines differ:\n"
                         + "".join(f"  warm only: {line}\n" for line in only_w[:8])
                         + "".join(f"  cold only: {line}\n" for line in only_c[:8]))
    return found, notes


def run(paths: list[Path], cold: bool, folder: Path) -> dict[str, list[dict]]:
    """Execute the lessons (warm, or cold) and return each one's launches."""
    workspace = make_workspace(folder / ("cold" if cold else "warm") / "course")
    found = {}
    saved = {name: os.environ.get(name) for name in (LOG, OFF)}
    try:
        if cold:
            os.environ[OFF] = "1"
        for path in paths:
            log = folder / f"{path.stem}.{'cold' if cold else 'warm'}.jsonl"
            os.environ[LOG] = str(log)
            execute(nbformat.read(path, as_version=4), folder / "out" / path.name, workspace)
            found[path.stem] = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return found


def compare(paths: list[Path], folder: Path) -> dict[str, tuple[list[str], list[str]]]:
    """{lesson: (differences, notes)} for the lessons, each run warm, then cold."""
    warm, cold = run(paths, False, folder), run(paths, True, folder)
    return {stem: differences(stem, warm[stem], cold[stem]) for stem in warm}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="lessons whose name contains this")
    args = parser.parse_args(argv)
    paths = [p for p in lessons() if args.only in p.name and not why_not_here(p)]
    with tempfile.TemporaryDirectory() as folder:
        found = compare(paths, Path(folder))
    total = 0
    for stem, (diffs, notes) in found.items():
        print(f"== {stem}: {len(diffs)} difference(s)")
        for line in diffs + notes:
            print(line)
        total += len(diffs)
    print(f"{len(found)} lessons, {total} difference(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
