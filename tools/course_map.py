"""The course map: the core path through the lessons, and the other lessons as topics to
take when needed, each with its reading minutes and its run seconds.

The titles and the reading minutes come from the notebooks, the seconds from the last
`make bench` (`tools/lesson_seconds.json`); only the order and the one-line reasons
below are written by hand. The same map goes into the README (between the two MARKERS
lines), into the last lesson cell that starts with MAP_HEADING in the first lesson, and,
with the run's own seconds, onto the site's index. `python -m tools.course_map --write`
rewrites the README and the lesson; a test fails when either differs from what this
module makes, or when a lesson is missing from the map.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import nbformat

from tools.course import MAP_HEADING, NOTEBOOKS, REPO, lessons, title, without_deep_dives

SECONDS_FILE = Path(__file__).resolve().parent / "lesson_seconds.json"
README = REPO / "README.md"
FIRST_LESSON = NOTEBOOKS / "00_ddp_in_ten_minutes.ipynb"
MARKERS = ("<!-- course map: made by `python -m tools.course_map --write` -->",
           "<!-- end of the course map -->")
EXERCISES = "## Exercises"

# For someone who must parallelise a training script tomorrow, in this order.
CORE = [
    ("00_ddp_in_ten_minutes", "a plain script made DDP, checked equal to one process, timed"),
    ("00_how_the_course_works", "how the lessons launch scripts and report their failures"),
    ("01_devices", "one device per rank, and what changes on GPUs"),
    ("05_ddp_training", "the sampler, metrics over all ranks, logging from rank 0"),
    ("07_checkpointing", "save and resume a DDP run exactly"),
    ("09_real_training", "unused parameters, gradient accumulation, mixed precision"),
    ("13_capstone_gpt", "a small GPT on real text, every piece in one loop"),
]
# The other lessons, by the question that sends a learner to them.
TOPICS = [
    ("How DDP works inside", [
        ("02_collectives", "what all-reduce and the other collectives do"),
        ("03_backends", "Gloo, NCCL and MPI, and how fast they move data"),
        ("04_init_methods", "how the processes find each other"),
        ("05_ddp", "what DDP does at construction and in backward"),
    ]),
    ("When a job fails, hangs or crawls", [
        ("04_rendezvous_failures", "a job that never starts"),
        ("06_skewed_speeds", "slow ranks, timeouts and uneven inputs"),
        ("07_checkpoints_survive", "checkpoints that survive workers, crashes and resharding"),
        ("08_fault_tolerance", "a rank that dies: restart and resume"),
        ("08_store_trap", "a restarted job that cannot reconnect"),
        ("14_debugging", "a hung job: find the rank, the line and the collective"),
    ]),
    ("Bigger models and real clusters", [
        ("10_beyond_allreduce", "compression, ZeRO, FSDP2 and torch.compile"),
        ("11_pipeline_ddp", "a model split over processes, with DDP"),
        ("12_clusters", "several hosts and Slurm"),
        ("15_will_it_scale", "predict a step's cost before adding GPUs"),
        ("16_slow_link", "a slow link between hosts, and the hooks that win it back"),
    ]),
]
WORDS_PER_MINUTE = 200  # prose and code alike, as reading-time estimates count them


def stems_in_map() -> list[str]:
    return [stem for stem, _ in CORE] + [stem for _, rows in TOPICS for stem, _ in rows]


def _words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def reading_minutes(nb) -> int:
    """The main path at reading speed, in whole minutes rounded up: markdown outside folded
    `<details>` blocks and images' alt text, and code, a line counted once (a script shown
    again with a few lines changed is read once); the exercises (from the `## Exercises`
    heading on) are work, not reading, and are left out."""
    prose = code = 0
    seen = set()
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "markdown":
            text = without_deep_dives(cell.source)
            text = re.sub(r"!\[[^\]]*\]", "", text)  # an image's alt text
            if EXERCISES in text:
                prose += _words(text.split(EXERCISES)[0])
                break
            prose += _words(text)
        elif not {"solution", "check", "parameters"} & set(tags):
            for line in cell.source.splitlines():
                if line.strip() not in seen:
                    seen.add(line.strip())
                    code += _words(line)
    return math.ceil((prose + code) / WORDS_PER_MINUTE)


def recorded_seconds() -> dict[str, float]:
    if not SECONDS_FILE.exists():
        return {}
    return {k: v for k, v in json.loads(SECONDS_FILE.read_text()).items()
            if not k.startswith("_")}


def record_seconds(seconds: dict[str, float], how: str) -> None:
    """Keep `make bench`'s seconds per lesson (stem: seconds) for the map."""
    data = {"_how": how, **{k: round(v, 1) for k, v in sorted(seconds.items())}}
    SECONDS_FILE.write_text(json.dumps(data, indent=1) + "\n")


def rows(seconds: dict[str, float] | None = None) -> list[dict]:
    """One dict per lesson in map order: stem, group, title, why, minutes, seconds."""
    seconds = recorded_seconds() if seconds is None else seconds
    found = []
    groups = [("core", CORE)] + list(TOPICS)
    for group, entries in groups:
        for stem, why in entries:
            nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
            found.append({"stem": stem, "group": group, "title": title(nb), "why": why,
                          "minutes": reading_minutes(nb), "seconds": seconds.get(stem)})
    return found


def _seconds(value) -> str:
    return "?" if value is None else f"{value:.0f} s"


def markdown(link_prefix: str = "") -> str:
    """The map as markdown; links are `link_prefix + stem + .ipynb`."""
    found = rows()
    core = [r for r in found if r["group"] == "core"]

    def link(r):
        return f"[{r['title']}]({link_prefix}{r['stem']}.ipynb)"

    lines = ["**The core path**, in order, for someone who must parallelise a training "
             f"script tomorrow (about {sum(r['minutes'] for r in core)} minutes of reading):",
             "", "| step | lesson | what you get | reading | run |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {link(r)} | {r['why']} | {r['minutes']} min | {_seconds(r['seconds'])} |"
              for i, r in enumerate(core, start=1)]
    lines += ["", "**Topics, when you need them:**", "",
              "| topic | lesson | take it for | reading | run |", "|---|---|---|---|---|"]
    for group, _ in TOPICS:
        for i, r in enumerate(r for r in found if r["group"] == group):
            lines.append(f"| {group if i == 0 else ''} | {link(r)} | {r['why']} | "
                         f"{r['minutes']} min | {_seconds(r['seconds'])} |")
    lines += ["", "Reading: the main text and its code at 200 words a minute, without the "
              "deep dives and the exercises. Run: seconds on 2 CPU cores (`make bench`)."]
    return "\n".join(lines)


def readme_text(readme: str) -> str:
    """`readme` with the map between the MARKERS replaced by today's map."""
    start, end = (readme.index(m) for m in MARKERS)
    return readme[:start + len(MARKERS[0])] + "\n\n" + markdown("notebooks/") + "\n\n" + \
        readme[end:]


def lesson_map_cell(nb):
    cells = [c for c in nb.cells
             if c.cell_type == "markdown" and c.source.startswith(MAP_HEADING)]
    if len(cells) != 1:
        raise ValueError(f"the first lesson needs one markdown cell starting {MAP_HEADING!r}")
    return cells[0]


def lesson_map_source() -> str:
    return f"{MAP_HEADING}\n\n{markdown()}"


def check() -> list[str]:
    """What is wrong with the map today (empty when nothing)."""
    problems = []
    in_map = stems_in_map()
    every = [p.stem for p in lessons()]
    missing = [s for s in every if s not in in_map]
    if missing:
        problems.append(f"lessons missing from the map (tools/course_map.py): {missing}")
    unknown = [s for s in in_map if s not in every]
    if unknown:
        problems.append(f"the map names lessons that do not exist: {unknown}")
    twice = sorted({s for s in in_map if in_map.count(s) > 1})
    if twice:
        problems.append(f"lessons in the map twice: {twice}")
    no_seconds = [s for s in every if s not in recorded_seconds()]
    if no_seconds:
        problems.append(f"no recorded seconds for {no_seconds}: run `make bench`")
    return problems


def write() -> None:
    README.write_text(readme_text(README.read_text()))
    nb = nbformat.read(FIRST_LESSON, as_version=4)
    lesson_map_cell(nb).source = lesson_map_source()
    nbformat.write(nb, FIRST_LESSON)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="rewrite the map in the README and in the first lesson")
    args = parser.parse_args(argv)
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if args.write and not problems:
        write()
        print(f"wrote the map into {README.name} and {FIRST_LESSON.name}")
    else:
        print(markdown("notebooks/"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
