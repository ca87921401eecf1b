"""Exercises: solutions in the notebooks, stubs for students, proof that checks can fail.

An exercise is two code cells, one after the other:

* a cell tagged ``solution`` holding a block between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION``, and the stub a student starts from as lines beginning with
  ``# STUB: `` (comments in the instructor's notebook, code in the student's);
* a cell tagged ``check`` that asserts the answer is right.

``student_version`` replaces each solution block with its stub. ``proof_version``
keeps the notebook whole and appends, after each check cell, the stub and the
same check run again, which must fail: one execution proves that every check
passes on its solution and fails on its stub. Exercises must not depend on each
other, since the proof leaves the stub's values behind.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

BEGIN, END, STUB = "### BEGIN SOLUTION", "### END SOLUTION", "# STUB: "
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


def exercise_cells(nb) -> list[tuple[int, int | None]]:
    """(solution cell index, check cell index) for every exercise, found by the tags alone
    (in a learner's notebook the solution blocks are gone; for `make grade`): each cell
    tagged `solution` with the first cell tagged `check` after it, or None where another
    solution (or the end) comes first. Cells a learner inserted in between do not matter."""
    solutions = [i for i, cell in enumerate(nb.cells) if "solution" in tags(cell)]
    found = []
    for i, after in zip(solutions, solutions[1:] + [len(nb.cells)]):
        checks = [j for j in range(i + 1, after) if "check" in tags(nb.cells[j])]
        found.append((i, checks[0] if checks else None))
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


def student_version(nb):
    nb = copy.deepcopy(nb)
    for i, _ in exercises(nb):
        nb.cells[i].source = stub_source(nb.cells[i].source)
    return nb


def proof_version(nb):
    """The whole notebook, plus after each exercise: its stub, then its check, expected to fail."""
    nb = copy.deepcopy(nb)
    pairs = exercises(nb)
    for number, (i, j) in reversed(list(enumerate(pairs, start=1))):
        stub = nbformat.v4.new_code_cell(stub_source(nb.cells[i].source))
        stub.metadata["tags"] = ["exercise-proof"]
        expect_fail = nbformat.v4.new_code_cell(_expect_failure(number, nb.cells[j].source))
        expect_fail.metadata["tags"] = ["exercise-proof"]
        nb.cells[j + 1:j + 1] = [stub, expect_fail]
    return nb


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
