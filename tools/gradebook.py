"""What `make grade` writes: a line per part of an exercise as it goes, a table (student by
lesson), the CSV gradebook and one feedback page per student."""

from __future__ import annotations

import csv
import html
from pathlib import Path

COLUMNS = ("student", "lesson", "exercise", "name", "part", "points", "max_points", "status",
           "message", "seconds")


def _points(x: float) -> str:
    return f"{x:g}"


def score(grades) -> tuple[float, float]:
    """(points scored, points possible) over the lessons graded here."""
    graded = [g for g in grades if g.status != "not graded"]
    return sum(g.scored for g in graded), sum(g.total for g in graded)


def print_lesson(student: str, grade, out=None) -> None:
    import sys
    out = out or sys.stdout
    for note in grade.notes:
        print(f"{student}  {grade.name}  note: {note}", file=out)
    if grade.stopped:
        print(f"{student}  {grade.name}  STOPPED: {grade.stopped}", file=out)
    for p in grade.parts:
        line = (f"{student}  {grade.name}  exercise {p.exercise} ({p.name}) {p.part}  "
                f"{p.status}  {_points(p.scored)}/{_points(p.points)}")
        if p.message and p.status != "passed":
            line += f": {p.message}"
        print(line, file=out)
    print(f"{student}  {grade.name}  score {_points(grade.scored)}/{_points(grade.total)}"
          + (f"  ({grade.status})" if grade.status != "graded" else
             f"  ({grade.seconds:.1f} s)"), file=out, flush=True)


def table(rows: dict, stems: list[str]) -> str:
    """Students by lessons: points scored/possible; `-` for a lesson not handed in (it
    scores 0), `n/g` for one not graded on this machine."""
    header = ["student", *stems, "total", "seconds"]
    lines = [header]
    for student, (grades, seconds) in rows.items():
        by_stem = {g.name: g for g in grades}
        cells = [student]
        for stem in stems:
            g = by_stem.get(stem)
            if g is None:
                cells.append("")
            elif g.status == "not graded":
                cells.append("n/g")
            elif g.status == "missing":
                cells.append(f"-/{_points(g.total)}")
            else:
                cells.append(f"{_points(g.scored)}/{_points(g.total)}")
        got, possible = score(grades)
        cells += [f"{_points(got)}/{_points(possible)}", f"{seconds:.0f}"]
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in lines)


def _write_rows(path: Path, columns, lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(lines)


def write_csv(path: Path, rows: dict) -> None:
    _write_rows(path, COLUMNS, ([student, g.name, p.exercise, p.name, p.part,
                                 _points(p.scored), _points(p.points), p.status, p.message,
                                 f"{p.seconds:.2f}"]
                                for student, (grades, _) in rows.items()
                                for g in grades for p in g.parts))


STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#222}table{border-collapse:collapse;margin:.5rem 0 1rem}td,th{border:1px solid #ccc;
padding:.25rem .5rem;text-align:left;vertical-align:top}.passed{color:#176f2c}
.failed,.missing{color:#a4161a}.notrun,.notgraded{color:#666}pre{white-space:pre-wrap;
background:#f6f6f6;padding:.4rem;margin:.3rem 0 0;font-size:.85rem}li{margin:.2rem 0}"""


def write_feedback(path: Path, student: str, grades) -> None:
    """One page per student: the score per lesson, then every part with what failed."""
    e = html.escape
    got, possible = score(grades)
    body = [f"<h1>Feedback for {e(student)}</h1>",
            f"<p>Score: <b>{_points(got)}/{_points(possible)}</b> points.</p>",
            "<table><tr><th>lesson</th><th>points</th><th>status</th></tr>"]
    for g in grades:
        body.append(f"<tr><td><a href='#{e(g.name)}'>{e(g.name)}</a></td>"
                    f"<td>{_points(g.scored)}/{_points(g.total)}</td><td>{e(g.status)}</td>"
                    f"</tr>")
    body.append("</table>")
    for g in grades:
        body.append(f"<h2 id='{e(g.name)}'>{e(g.name)}: {_points(g.scored)}/"
                    f"{_points(g.total)}</h2>")
        if g.stopped:
            body.append(f"<p class='failed'>The lesson stopped: {e(g.stopped)}</p>")
        if g.notes:
            body.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in g.notes) + "</ul>")
        body.append("<table><tr><th>exercise</th><th>part</th><th>points</th>"
                    "<th>result</th></tr>")
        for p in g.parts:
            result = e(p.status)
            if p.message and p.status != "passed":
                result += f": {e(p.message)}"
            if p.detail and p.status != "passed":
                result += f"<pre>{e(p.detail)}</pre>"
            css = p.status.replace(" ", "")
            body.append(f"<tr><td>{p.exercise} ({e(p.name)})</td><td>{e(p.part)}</td>"
                        f"<td>{_points(p.scored)}/{_points(p.points)}</td>"
                        f"<td class='{css}'>{result}</td></tr>")
        body.append("</table>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("<!doctype html><meta charset='utf-8'><title>Feedback: "
                    f"{e(student)}</title><style>{STYLE}</style>\n" + "\n".join(body) + "\n")


# For the instructor: totals for an LMS, and a report ---------------------------------------

TOTAL_COLUMNS = ("student", "points", "max_points", "percent")
# notes that say a student's code or notebook did more than answer (tools/grade.py)
TAMPERING = ("your code ", "check cell was changed", "check cell was deleted",
             "lost its `check` tag", "tags on your own cells")


def write_totals(path: Path, rows: dict) -> None:
    """One line per student: the points over every lesson graded here (an LMS imports it)."""
    def line(student, grades):
        got, possible = score(grades)
        return [student, _points(got), _points(possible),
                f"{100 * got / possible:.1f}" if possible else ""]
    _write_rows(path, TOTAL_COLUMNS, (line(s, grades) for s, (grades, _) in rows.items()))


def tampering(grades) -> list[str]:
    """What a student's code or notebook did besides answering, as the grader noted it."""
    return [f"{g.name}: {note}" for g in grades for note in g.notes
            if any(mark in note for mark in TAMPERING)]


def forged_visible(grades) -> list[str]:
    """Exercises whose visible check passed and a hidden one failed: a near miss, or a
    visible check passed by other means than a right answer."""
    found = []
    for g in grades:
        by_exercise = {}
        for p in g.parts:
            by_exercise.setdefault(p.exercise, []).append(p)
        for number, parts in by_exercise.items():
            visible = [p for p in parts if p.part == "check"]
            failed = [p for p in parts if p.part != "check" and p.status == "failed"]
            if visible and visible[0].status == "passed" and failed:
                found.append(f"{g.name} exercise {number} ({parts[0].name}): "
                             + "; ".join(f"{p.part}: {p.message[:100]}" for p in failed))
    return found


def write_report(path: Path, rows: dict) -> None:
    """The instructor's report: per student, the tampering noted and the exercises whose
    visible check passed while a hidden one failed; per part of every exercise, how the
    class did."""
    def cell(text):
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = [f"# Grading report: {len(rows)} student(s)", "",
             "## Per student: tampering noted, visible passed and hidden failed", ""]
    any_found = False
    for student, (grades, _) in rows.items():
        found = [f"tampering: {t}" for t in tampering(grades)]
        found += [f"visible passed, hidden failed: {v}" for v in forged_visible(grades)]
        if found:
            any_found = True
            lines += [f"- **{cell(student)}**"] + [f"  - {cell(f)}" for f in found]
    if not any_found:
        lines.append("Nothing noted.")
    lines += ["", "## Per exercise", "",
              "| lesson | exercise | part | passed | failed | not attempted | other | "
              "median seconds | most common failure |", "|---|---|---|---|---|---|---|---|---|"]
    parts: dict = {}
    for grades, _ in rows.values():
        for g in grades:
            for p in g.parts:
                parts.setdefault((g.name, p.exercise, p.name, p.part), []).append(p)
    for (lesson, number, name, part), found in parts.items():
        untried = [p for p in found if p.message.startswith("not attempted")]
        failed = [p for p in found if p.status == "failed" and p not in untried]
        passed = [p for p in found if p.status == "passed"]
        other = len(found) - len(passed) - len(failed) - len(untried)
        seconds = sorted(p.seconds for p in passed + failed)
        median = f"{seconds[len(seconds) // 2]:.1f}" if seconds else ""
        messages: dict = {}
        for p in failed:
            first = p.message[:80]
            messages[first] = messages.get(first, 0) + 1
        common = max(messages.items(), key=lambda m: m[1]) if messages else None
        lines.append(f"| {lesson} | {number} ({cell(name)}) | {part} | {len(passed)} | "
                     f"{len(failed)} | {len(untried)} | {other} | {median} | "
                     + (f"{common[1]}x: {cell(common[0])}" if common else "") + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
