"""The lessons' checks that compare times, and what each was decided to be (issue 40: a
learner's laptop is busy). A check found here that is neither guarded (it runs only under
an `if` on the processes' share of a core, their threads, or a machine without GPUs) nor
listed below with its reason fails tests/test_hygiene.py: a new timing claim is decided,
not left to fail on a busy machine.

    python -m tools.timing_checks     # every timing check, guarded or listed, and why
"""

from __future__ import annotations

import re
import sys

import nbformat

from tools.course import lessons

TIMING = re.compile(r"seconds|speedup|_speed|per_second|elapsed|waited|_time\b|\"time\"|"
                    r"\btimes\b|busbw|bandwidth|\bms\b|overlap|\bsecs?\b")
GUARD = re.compile(r"share|no_gpu_possible|threads")

LOWER = "a lower bound: a busy machine only makes the wait longer"
ORDER = "the order of events in one run, which load does not change"
NOT_TIMING = "not a timing claim: a format, a formula or a default read from torch"
MARGIN = "an upper bound with a margin (seconds), passed under `make soak`'s load"
RATIO = "a ratio measured in the same run, passed under `make soak`'s load"

# (lesson stem, a piece of the assert's first line): why it may stay as it is
DECIDED = {
    ("01_how_the_course_works", "assert len(times) == world_size"): NOT_TIMING,
    ("01_how_the_course_works", "re.fullmatch("): NOT_TIMING,
    ("01_how_the_course_works", "== min(times)"): ORDER,
    ("10_collectives", "left >= last_arrival"): ORDER,
    ("10_collectives", "waited >= 0.2"): LOWER,
    ("10_collectives", "last_arrival < 0.5"): MARGIN,
    ("10_collectives", "naive_elements(1024, 64)"): NOT_TIMING,
    ("11_backends", "assert speedup > 2"): RATIO,
    ("11_backends", "abs(bus_bandwidth("): NOT_TIMING,
    ("11_backends", "bus_bandwidth(8e9, 1.0, 8)"): NOT_TIMING,
    ("11_backends", "abs(achieved - bandwidth / 2)"): NOT_TIMING,
    ("11_backends", "half_bandwidth_size("): NOT_TIMING,
    ("12_init_methods", "1 <= seconds < 1 + 10"): MARGIN,
    ("13_inside_ddp", 'timeline["buckets"][0]["at"]'): ORDER,
    ("13_inside_ddp", 'b["done"] < watch["backward_seconds"]'): ORDER,
    ("20_rendezvous_failures", '"Timed out after 2 seconds'): NOT_TIMING,
    ("20_rendezvous_failures", 'never["seconds"] < 2 + 3'): MARGIN,
    ("20_rendezvous_failures", 'busy["seconds"] < 5'): MARGIN,
    ("20_rendezvous_failures", "fires_at(1) <= never"): MARGIN,
    ("21_skewed_speeds", "stall_timeout <= waited < stall_timeout + 2"): MARGIN,
    ("21_skewed_speeds", 'root_rank != stall["slow_rank"]'): NOT_TIMING,
    ("21_skewed_speeds", 'short / 2 <= named["seconds"] < short * 2'): MARGIN,
    ("21_skewed_speeds", 'o["seconds"] >= 0.8 * short'): LOWER,
    ("21_skewed_speeds", 'o["seconds"] < short / 2'): MARGIN,
    ("21_skewed_speeds", 'first["seconds"] >= short'): LOWER,
    ("21_skewed_speeds", 'short <= first["seconds"] < short + 2'): MARGIN,
    ("23_fault_tolerance", 'kill["time"] < resumed["time"] < back["time"]'): ORDER,
    ("23_fault_tolerance", 'back["time"] - resumed["time"] < 0.2'): RATIO,
    ("23_fault_tolerance", "restart_cost(events) =="): NOT_TIMING,
    ("25_debugging", "collective_timeout <= s < 2 * collective_timeout"): MARGIN,
    ("25_debugging", 'f"Timed out waiting {collective_timeout * 1000}ms"'): NOT_TIMING,
    ("25_debugging", 'r"DefaultTimeout ='): NOT_TIMING,
    ("25_debugging", 'r"NCCLDefaultTimeout ='): NOT_TIMING,
    ("31_pipeline_ddp", 'order.index("forward") < last["recv"]'): ORDER,
    ("32_clusters", "float(seconds) >= 3"): LOWER,
    ("32_clusters", "RendezvousTimeout().join"): NOT_TIMING,
    ("32_clusters", "2 <= failed.seconds < 60"): MARGIN,
    ("33_will_it_scale", 'r["measured"] > 0.8 * r["overlap"]'): RATIO,
    ("33_will_it_scale", "-0.5 <= error <= 0.5"): RATIO,
    ("33_will_it_scale", 'r["measured"] > 1.15 * r["overlap"]'): RATIO,
    ("33_will_it_scale", 'abs(error) < r["measured"]'): RATIO,
    ("33_will_it_scale", "best >= 0.9 * one_message"): RATIO,
    ("33_will_it_scale", "value > 0 for value in times[most]"): NOT_TIMING,
    ("33_will_it_scale", 'times[one]["backward_compute_comm_overlap_time"] <'): RATIO,
    ("33_will_it_scale", '"backward_comm_time"] > 1.3'): RATIO,
    ("34_slow_link", "times[1] < 0.7 * times[0]"): RATIO,
    ("34_slow_link", "0.9 < waited / ours < 1.6"): RATIO,
    ("40_capstone_gpt", 'f"Timed out waiting {int(trap_timeout * 1000)}ms"'): NOT_TIMING,
}


def decision(stem: str, line: str) -> list[str]:
    """The DECIDED entries (as text) that name this assert."""
    return [piece for (where, piece) in DECIDED if where == stem and piece in line]


def found(paths=None) -> list[tuple[str, str, str | None]]:
    """(stem, the assert's first line, the guard it runs under or None) for every assert in a
    lesson's code (not a script it writes, not an exercise's solution) whose condition
    compares times."""
    checks = []
    for path in lessons() if paths is None else paths:
        for cell in nbformat.read(path, as_version=4).cells:
            if (cell.cell_type != "code" or "solution" in cell.metadata.get("tags", [])
                    or cell.source.startswith("%%")):
                continue
            lines = cell.source.splitlines()
            for j, line in enumerate(lines):
                if not line.strip().startswith("assert"):
                    continue
                indent = len(line) - len(line.lstrip())
                statement = line.strip()
                for more in lines[j + 1:]:
                    if len(more) - len(more.lstrip()) <= indent:
                        break
                    statement += " " + more.strip()
                condition = re.split(r''', f?["']''', statement)[0]
                if not TIMING.search(condition):
                    continue
                guard = None
                for above in reversed(lines[:j]):
                    depth = len(above) - len(above.lstrip())
                    if above.strip() and depth < indent and re.match(r"\s*(if|elif)\b", above):
                        guard = above.strip() if GUARD.search(above) else None
                        break
                    if above.strip() and depth == 0:
                        break
                checks.append((path.stem, line.strip(), guard))
    return checks


def undecided(paths=None) -> list[str]:
    """Timing asserts neither guarded nor named by exactly one DECIDED entry."""
    return [f"{stem}: {line}" for stem, line, guard in found(paths)
            if guard is None and len(decision(stem, line)) != 1]


def stale() -> list[tuple[str, str]]:
    """DECIDED entries that name no assert any more."""
    lines = found()
    return sorted(key for key in DECIDED
                  if not any(stem == key[0] and key[1] in line for stem, line, _ in lines))


if __name__ == "__main__":
    for stem, line, guard in found():
        named = decision(stem, line)
        why = f"guarded: {guard}" if guard else DECIDED[(stem, named[0])] if len(
            named) == 1 else "UNDECIDED"
        print(f"{stem} | {line[:70]} | {why}")
    sys.exit(1 if undecided() or stale() else 0)
