"""Exercises: solutions in the notebooks, stubs for students, proof that checks can fail.

An exercise is two code cells, one after the other:

* a cell tagged ``solution`` holding a block between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``, and the stub a student starts from as lines beginning with
  ``# STUB: `` (comments in the instructor's notebook, code in the student's);
* a cell tagged ``check`` that asserts the answer is right;
* for `make grade` only (the lesson, its page and the handout leave them out): cells
  tagged ``hidden``, more checks that the learner does not see (often the visible check
  again at another world size: ``visible_check(world_size=3)``), and raw cells tagged
  ``near-miss``, each a plausible wrong answer written as a change to the solution
  (``- old line`` / ``+ new line``) that passes the visible check and fails a hidden one.

An exercise's parts: its visible check, and each hidden check, each worth the
``metadata.points`` of its cell (1 when unset): `make grade` gives credit part by part.

``student_version`` replaces each solution block with its stub and drops the hidden and
near-miss cells. ``proof_version`` keeps the notebook whole and adds, after each
exercise: its hidden checks (which must pass), each near miss with the visible check
(which must pass) and the hidden ones (one must fail), then the stub and the visible
check again, which must fail: one execution proves all of it. Exercises must not depend
on each other, since the proof leaves the stub's values behind.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

BEGIN, END, STUB = "### BEGIN SOLUTION", "### END SOLUTION", "# STUB: "
SOLUTION, CHECK, HIDDEN, NEAR_MISS = "solution", "check", "hidden", "near-miss"
GRADING_ONLY = (HIDDEN, NEAR_MISS)  # cells that only `make grade` and the proof run
_BLOCK = re.compile(rf"^[ \t]*{re.escape(BEGIN)}[^\n]*\n.*?^[ \t]*{re.escape(END)}[^\n]*(\n|$)",
                    re.S | re.M)


WRITEFILE = re.compile(r"%%writefile\s+(-a\s+)?(\S+)\n")


class ExerciseFormatError(ValueError):
    pass


def written_scripts(nb, notebook_dir) -> dict:
    """What a notebook's `%%writefile` cells write: {resolved target: (text, cells)}, the
    text joined from a `%%writefile` cell and the `-a` pieces after it, exactly as IPython
    writes it (each cell's body ends with one newline), and the cells that wrote it."""
    written: dict = {}
    for cell in nb.cells:
        m = WRITEFILE.match(cell.source) if cell.cell_type == "code" else None
        if not m:
            continue
        target = (Path(notebook_dir) / m.group(2)).resolve()
        body = cell.source[m.end():].rstrip("\n") + "\n"
        text, cells = written.get(target, ("", [])) if m.group(1) else ("", [])
        written[target] = (text + body, cells + [cell])
    return written


def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def points(cell) -> float:
    return cell.get("metadata", {}).get("points", 1)


@dataclass
class Exercise:
    """An exercise's cells, by index: its solution, its visible checks (the cells tagged
    `check` right after it), its hidden checks and its near misses (after those)."""
    number: int
    solution: int
    checks: list[int]
    hidden: list[int] = field(default_factory=list)
    near_misses: list[int] = field(default_factory=list)
    name: str = ""


def exercise_name(source: str) -> str:
    """What a learner writes: the script of a `%%writefile` solution, or its first function."""
    m = WRITEFILE.match(source)
    if m:
        return Path(m.group(2)).name
    m = re.search(r"^\s*(?:# STUB: )?def (\w+)\(", source, re.M) or re.search(
        r"^\s*(?:# STUB: )?(\w+) =", source, re.M)
    return m.group(1) if m else ""


def exercise_list(nb, strict: bool = True) -> list[Exercise]:
    """Every exercise of an instructor's notebook, its format checked; with strict=False,
    of a learner's too (found by the tags alone: their answers hold no solution block)."""
    found = []
    starts = [i for i, _ in exercises(nb)] if strict else [
        i for i, cell in enumerate(nb.cells) if SOLUTION in tags(cell)]
    for number, i in enumerate(starts, start=1):
        ex = Exercise(number, i, [], name=exercise_name(nb.cells[i].source))
        j = i + 1
        while j < len(nb.cells) and CHECK in tags(nb.cells[j]):
            ex.checks.append(j)
            j += 1
        while j < len(nb.cells) and HIDDEN in tags(nb.cells[j]):
            ex.hidden.append(j)
            j += 1
        while j < len(nb.cells) and NEAR_MISS in tags(nb.cells[j]):
            if nb.cells[j].cell_type != "raw":
                raise ExerciseFormatError(f"cell {j}: a near miss is a raw cell")
            near_miss_source(nb.cells[i].source, nb.cells[j].source)  # it must apply
            ex.near_misses.append(j)
            j += 1
        if ex.near_misses and not ex.hidden:
            raise ExerciseFormatError(f"cell {i}: near misses without a hidden check")
        found.append(ex)
    for j, cell in enumerate(nb.cells):
        if any(t in tags(cell) for t in GRADING_ONLY) and not any(
                j in ex.hidden + ex.near_misses for ex in found):
            raise ExerciseFormatError(f"cell {j} (hidden or near miss) does not follow an "
                                      f"exercise's check")
    return found


def near_miss_source(solution: str, change: str) -> str:
    """The solution with a near miss's change applied. The change is lines `- old` then
    `+ new` (a `-` or `+` and one space, or the sign alone for an empty line), in groups;
    other lines describe it. Each group's old text must occur once in the solution."""
    groups: list[tuple[list[str], list[str]]] = []
    for line in change.splitlines():
        sign, text = line[:1], line[2:] if line[1:2] == " " else line[1:]
        if sign == "-":
            if not groups or groups[-1][1]:
                groups.append(([], []))
            groups[-1][0].append(text)
        elif sign == "+" and groups:
            groups[-1][1].append(text)
    if not groups:
        raise ExerciseFormatError("a near miss holds no '- old' / '+ new' lines")
    for old, new in groups:
        old_text, new_text = "\n".join(old), "\n".join(new)
        if solution.count(old_text) != 1:
            raise ExerciseFormatError(f"a near miss's '- ' lines occur "
                                      f"{solution.count(old_text)} times in the solution, "
                                      f"not once: {old_text!r}")
        solution = solution.replace(old_text, new_text)
    return solution


def exercises(nb) -> list[tuple[int, int]]:
    """(solution cell index, check cell index) for every exercise; checks the format."""
    found = []
    for i, cell in enumerate(nb.cells):
        if "solution" not in tags(cell):
            continue
        if not _BLOCK.search(cell.source):
            raise ExerciseFormatError(f"cell {i} is tagged 'solution' but has no "
                                      f"{BEGIN} ... {END} block")
        if not stub_lines(cell.source):
            raise ExerciseFormatError(f"cell {i} has no '{STUB}' line for the student version")
        if i + 1 >= len(nb.cells) or "check" not in tags(nb.cells[i + 1]):
            raise ExerciseFormatError(f"cell {i} (a solution) is not followed by a cell "
                                      f"tagged 'check'")
        found.append((i, i + 1))
    return found


def stub_lines(source: str) -> list[str]:
    return [line.strip()[len(STUB):] for line in source.splitlines()
            if line.strip().startswith(STUB)]


def stub_source(source: str) -> str:
    """The solution cell as a student gets it: each block replaced by its stub code, the
    `# STUB: ` lines between the block before it (or the cell's start) and it; the last
    block also takes those after it. With one block: every stub line of the cell."""
    blocks = list(_BLOCK.finditer(source))
    stubs = []
    for k, block in enumerate(blocks):
        region = source[blocks[k - 1].end() if k else 0:block.start()]
        if k == len(blocks) - 1:
            region += source[block.end():]
        indent = re.match(r"[ \t]*", block.group(0)).group(0)
        stubs.append("".join(f"{indent}{line}\n" for line in stub_lines(region)))
    numbers = iter(range(len(blocks)))
    kept = "\n".join(line for line in _BLOCK.sub(lambda m: f"\0{next(numbers)}\0", source)
                     .splitlines() if not line.strip().startswith(STUB))
    for k, stub in enumerate(stubs):
        kept = kept.replace(f"\0{k}\0", stub)
    return kept.rstrip("\n")


def without_grading_cells(nb):
    """The lesson as it runs and renders, and as the learner gets it: no hidden checks,
    no near misses."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if not any(t in tags(c) for t in GRADING_ONLY)]
    return nb


def student_version(nb):
    nb = copy.deepcopy(nb)
    for i, _ in exercises(nb):
        nb.cells[i].source = stub_source(nb.cells[i].source)
    return without_grading_cells(nb)


VISIBLE_CHECK = """\
import os as _os, sys as _sys
_sys.path.insert(0, _os.path.dirname(_os.getcwd()))  # the course: ../tools
from tools.grade_kernel import check_again as _check_again


def visible_check(**names):
    \"\"\"Exercise {number}'s visible check again, with `names` set while it runs.\"\"\"
    _check_again({source!r}, globals(), {filename!r}, **names)
"""


def visible_check_source(nb, ex: Exercise) -> str:
    """The code that defines `visible_check` for exercise `ex`'s hidden checks."""
    source = "\n".join(nb.cells[j].source for j in ex.checks)
    return VISIBLE_CHECK.format(number=ex.number, source=source,
                                filename=f"<exercise {ex.number} check>")


def proof_version(nb):
    """The whole notebook, plus after each exercise: its hidden checks (expected to pass),
    each near miss with the visible check (to pass) and the hidden ones (one to fail),
    then its stub and its visible check, expected to fail."""
    nb = copy.deepcopy(nb)

    def cell(source):
        new = nbformat.v4.new_code_cell(source)
        new.metadata["tags"] = ["exercise-proof"]
        return new

    for ex in reversed(exercise_list(nb)):
        n, solution = ex.number, nb.cells[ex.solution].source
        visible = "\n".join(nb.cells[j].source for j in ex.checks)
        added = [cell(visible_check_source(nb, ex))] if ex.hidden else []
        added += [cell(nb.cells[j].source + f"\nprint('exercise {n}: hidden check passes')")
                  for j in ex.hidden]
        for k, j in enumerate(ex.near_misses, start=1):
            added += [cell(near_miss_source(solution, nb.cells[j].source)),
                      cell(visible + f"\nprint('exercise {n}: near miss {k} passes the "
                                     f"visible check')"),
                      cell(_expect_hidden_failure(n, k, [nb.cells[h].source
                                                         for h in ex.hidden]))]
        added += [cell(stub_source(solution)), cell(_expect_failure(n, visible))]
        last = (ex.near_misses or ex.hidden or ex.checks)[-1]
        nb.cells[ex.checks[0] + len(ex.checks):last + 1] = added
        # the hidden and near-miss cells are replaced by the proof's own
    return nb


def _expect_hidden_failure(number: int, near_miss: int, hidden: list[str]) -> str:
    return (
        f"# Exercise {number}, near miss {near_miss}: a hidden check must reject it.\n"
        f"_failures = []\n"
        f"for _source in {hidden!r}:\n"
        f"    try:\n"
        f"        exec(compile(_source, 'hidden check {number}', 'exec'), globals())\n"
        f"    except Exception as _error:\n"
        f"        _failures.append(f'{{type(_error).__name__}}: {{_error}}'[:300])\n"
        f"assert _failures, 'exercise {number}: near miss {near_miss} passed every hidden "
        f"check'\n"
        f"print('exercise {number}: near miss {near_miss} fails a hidden check:', "
        f"_failures[0])\n"
    )


def _expect_failure(number: int, check_source: str) -> str:
    return (
        f"# Exercise {number}: the check must reject the stub.\n"
        f"try:\n"
        f"    exec(compile({check_source!r}, 'check {number}', 'exec'), globals())\n"
        f"except Exception as stub_error:\n"
        f"    print('exercise {number}: the stub fails its check:', "
        f"type(stub_error).__name__, stub_error)\n"
        f"else:\n"
        f"    raise AssertionError('exercise {number}: its check passed on the stub')\n"
    )
