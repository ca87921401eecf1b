"""The course map: the core path through the lessons, and the other lessons as topics to
take when needed, each with its reading minutes and its run seconds; the README's table of
lessons; and each lesson's closing "**Next:**" line.

The lessons, their order, parts and lines come from the registry (tools/lessons.py), the
titles and the reading minutes from the notebooks, the seconds from the last `make bench`
(`tools/lesson_seconds.json`). The map goes into the README (between the two MARKERS
lines), into the last lesson cell that starts with MAP_HEADING in the first lesson, and,
with the run's own seconds, onto the site's index. `python -m tools.course_map --write`
rewrites them all, and the scripts that the lessons' `%%writefile` cells write; a test
fails when any differs from what this module makes, or when a lesson is missing from the
registry.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import nbformat

from tools import lessons as registry
from tools.course import MAP_HEADING, NEXT, NOTEBOOKS, REPO, lessons, title, without_deep_dives
from tools.exercises import written_scripts

SECONDS_FILE = Path(__file__).resolve().parent / "lesson_seconds.json"
README = REPO / "README.md"
FIRST_LESSON = NOTEBOOKS / "00_ddp_in_ten_minutes.ipynb"
MARKERS = ("<!-- course map: made by `python -m tools.course_map --write` -->",
           "<!-- end of the course map -->")
TABLE_MARKERS = ("<!-- lessons: made by `python -m tools.course_map --write` from "
                 "tools/lessons.py -->", "<!-- end of the lessons -->")
COURSE_MAP_LINK = "[the course map](00_ddp_in_ten_minutes.ipynb#The-course-map)"
EXERCISES = "## Exercises"

PROSE_WORDS_PER_MINUTE = 200  # as reading-time estimates count prose
CODE_WORDS_PER_MINUTE = 100  # unfamiliar code, as a newcomer read it (issue 39: about 100)


def folded(cell) -> bool:
    """A code cell shown folded (JupyterLab's collapsed input; the site puts it in a
    <details>): the course's plumbing, not code a learner writes in their own script."""
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def core() -> list[tuple[str, str]]:
    """(stem, why) of the core path's lessons, in order (tools/lessons.py)."""
    return [(lesson.stem, lesson.why) for lesson in registry.LESSONS
            if lesson.part == registry.CORE]


def topics() -> list[tuple[str, list[tuple[str, str]]]]:
    """(question, [(stem, why), ...]) of the topics, in order (tools/lessons.py)."""
    return [(part, [(lesson.stem, lesson.why) for lesson in registry.LESSONS
                    if lesson.part == part])
            for part in registry.parts() if part != registry.CORE]


def stems_in_map() -> list[str]:
    return [lesson.stem for lesson in registry.LESSONS]


def _words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def reading_minutes(nb) -> int:
    """The main path at reading speed, in whole minutes rounded up: markdown outside folded
    `<details>` blocks and images' alt text at 200 words a minute, and code that is not
    folded and does not check a run (tagged `check`) at 100, a line counted once (a script
    shown again with a few lines changed is read once); the exercises (from the
    `## Exercises` heading on) are work, not reading, and are left out."""
    prose = code = 0
    seen = set()
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "markdown" and cell.source.startswith(MAP_HEADING):
            continue  # the map (lesson 00): made here, a table to look up, not to read
        if cell.cell_type == "markdown":
            text = without_deep_dives(cell.source).split(NEXT)[0]  # the Next line: made
            text = re.sub(r"!\[[^\]]*\]", "", text)  # an image's alt text
            if EXERCISES in text:
                prose += _words(text.split(EXERCISES)[0])
                break
            prose += _words(text)
        elif not {"solution", "check", "parameters"} & set(tags) and not folded(cell):
            for line in cell.source.splitlines():
                if line.strip() not in seen:
                    seen.add(line.strip())
                    code += _words(line)
    return math.ceil(prose / PROSE_WORDS_PER_MINUTE + code / CODE_WORDS_PER_MINUTE)


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
    groups = [("core", core())] + topics()
    for group, entries in groups:
        for stem, why in entries:
            nb = _read(stem)
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
             "", "| lesson | what you get | reading | run |", "|---|---|---|---|"]
    lines += [f"| {link(r)} | {r['why']} | {r['minutes']} min | {_seconds(r['seconds'])} |"
              for r in core]
    first, last = core[0], core[-1]
    lines += ["", f"**Short of time?** Read {link(first)}, then {link(last)} (about "
              f"{first['minutes'] + last['minutes']} minutes); each piece of the script names "
              "the lesson that explains it."]
    lines += ["", "**Topics, when you need them:**", "",
              "| topic | lesson | take it for | reading | run |", "|---|---|---|---|---|"]
    for group, _ in topics():
        for i, r in enumerate(r for r in found if r["group"] == group):
            lines.append(f"| {group if i == 0 else ''} | {link(r)} | {r['why']} | "
                         f"{r['minutes']} min | {_seconds(r['seconds'])} |")
    lines += ["", "Reading: text at 200 words a minute, code at 100; deep dives, folded code, "
              "checks and exercises not counted. Run: seconds on 2 CPU cores (`make bench`)."]
    return "\n".join(lines)


def _between(text: str, markers: tuple[str, str], inside: str) -> str:
    start, end = (text.index(m) for m in markers)
    return text[:start + len(markers[0])] + "\n\n" + inside + "\n\n" + text[end:]


def lessons_table() -> str:
    """The README's table of lessons, in reading order: what each shows (tools/lessons.py)."""
    lines = ["| # | lesson | what it shows, executed and checked |", "|---|---|---|"]
    for lesson in registry.LESSONS:
        name = re.sub(r"^\d+ · ", "", title(_read(lesson.stem)))
        lines.append(f"| {lesson.stem[:2]} | [{name}](notebooks/{lesson.stem}.ipynb) | "
                     f"{lesson.shows} |")
    return "\n".join(lines)


FIGURE = re.compile(r"<!-- figure: ([\w-]+) -->(.*?)<!-- / -->")


def figures() -> dict[str, str]:
    """The README's counted figures, each between `<!-- figure: NAME -->` and `<!-- / -->`:
    the number of lessons and the points `make grade` gives (every part of every exercise,
    hidden checks included), counted from the notebooks as the grader counts them."""
    from tools.grade import _parts_of  # the grader's own count of parts and points

    points = {lesson.stem: sum(p.points for p in _parts_of(_read(lesson.stem)))
              for lesson in registry.LESSONS}
    capstone = [stem for stem in points if "capstone" in stem]
    with_exercises = [stem for stem, n in points.items() if n and stem not in capstone]

    def n(x: float) -> str:
        return f"{x:g}"
    return {"lessons": n(len(registry.LESSONS)),
            "points": n(sum(points.values())),
            "lessons-graded-but-capstone": n(len(with_exercises)),
            "points-but-capstone": n(sum(points[s] for s in with_exercises)),
            "capstone-points": n(sum(points[s] for s in capstone))}


def with_figures(text: str) -> str:
    """`text` with each counted figure replaced by today's count (an unknown name raises)."""
    counted = figures()

    def fill(m: re.Match) -> str:
        if m.group(1) not in counted:
            raise KeyError(f"no figure named {m.group(1)!r}; tools/course_map.py counts "
                           f"{sorted(counted)}")
        return f"<!-- figure: {m.group(1)} -->{counted[m.group(1)]}<!-- / -->"
    return FIGURE.sub(fill, text)


def readme_text(readme: str) -> str:
    """`readme` with the map, the table of lessons and the counted figures replaced by
    today's."""
    return with_figures(_between(_between(readme, MARKERS, markdown("notebooks/")),
                                 TABLE_MARKERS, lessons_table()))


def _read(stem: str):
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def next_line(stem: str) -> str:
    """A lesson's closing line: the lesson that follows it in the reading order."""
    order = registry.LESSONS
    i = [lesson.stem for lesson in order].index(stem)
    if i == len(order) - 1:
        return f"{NEXT} this is the last lesson. Back to {COURSE_MAP_LINK}."
    after = order[i + 1]
    link = f"[{title(_read(after.stem))}]({after.stem}.ipynb): {after.why}"
    if after.part == order[i].part:
        return f"{NEXT} {link}. All the lessons: {COURSE_MAP_LINK}."
    if order[i].part == registry.CORE:
        return (f"{NEXT} that was the core path. The topics follow, each for the question "
                f"that sends you to it ({COURSE_MAP_LINK}); *{after.part}* begins with {link}.")
    return (f"{NEXT} the next topic, *{after.part}*, begins with {link}. All the lessons: "
            f"{COURSE_MAP_LINK}.")


def next_cell(nb):
    """The lesson's cell holding its NEXT line (the last such markdown cell)."""
    cells = [c for c in nb.cells if c.cell_type == "markdown" and NEXT in c.source]
    if not cells:
        raise ValueError(f"a lesson ends with a markdown cell holding {NEXT!r}")
    return cells[-1]


def with_next_line(source: str, stem: str) -> str:
    return source[:source.index(NEXT)] + next_line(stem)


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
        problems.append(f"lessons missing from the registry: {missing}; add each to LESSONS "
                        "in tools/lessons.py, where its part of the course and its place in "
                        "the reading order are (CONTRIBUTING.md)")
    unknown = [s for s in in_map if s not in every]
    if unknown:
        problems.append(f"tools/lessons.py names lessons that do not exist: {unknown}")
    twice = sorted({s for s in in_map if in_map.count(s) > 1})
    if twice:
        problems.append(f"lessons in tools/lessons.py twice: {twice}")
    no_seconds = [s for s in every if s not in recorded_seconds()]
    if no_seconds:
        problems.append(f"no recorded seconds for {no_seconds}: time each with `python -m "
                        f"tools.bench --repeats 1 --only STEM` (or the whole course: `make "
                        "bench`)")
    return problems


def write() -> None:
    README.write_text(readme_text(README.read_text()))
    for lesson in registry.LESSONS:
        path = NOTEBOOKS / f"{lesson.stem}.ipynb"
        nb = nbformat.read(path, as_version=4)
        for target, (text, _) in written_scripts(nb, NOTEBOOKS).items():
            if not target.is_file() or target.read_text() != text:
                target.parent.mkdir(exist_ok=True)  # a new lesson's folder
                target.write_text(text)  # the scripts its %%writefile cells write
        cell = next_cell(nb)
        cell.source = with_next_line(cell.source, lesson.stem)
        if path == FIRST_LESSON:
            lesson_map_cell(nb).source = lesson_map_source()
        nbformat.write(nb, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true",
                        help="rewrite the map in the README and in the first lesson")
    args = parser.parse_args(argv)
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    # a lesson without its seconds yet is written with "?" (timing it writes them)
    blocking = [problem for problem in problems if not problem.startswith("no recorded")]
    if args.write and not blocking:
        write()
        print(f"wrote the map and the lessons into {README.name}, the map into "
              f"{FIRST_LESSON.name}, each lesson's {NEXT} line and the scripts its "
              "%%writefile cells write")
    else:
        print(markdown("notebooks/"))
    return 1 if (blocking if args.write else problems) else 0


if __name__ == "__main__":
    sys.exit(main())
