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


def write_csv(path: Path, rows: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for student, (grades, _) in rows.items():
            for g in grades:
                for p in g.parts:
                    writer.writerow([student, g.name, p.exercise, p.name, p.part,
                                     _points(p.scored), _points(p.points), p.status,
                                     p.message, f"{p.seconds:.2f}"])


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
