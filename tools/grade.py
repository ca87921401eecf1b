"""`make grade`: grade a class's notebooks against the instructor's copy of the course.

    python -m tools.grade PATH ... [--lessons 02_devices,11_backends] [--out build/grades]
                          [--shard K/N] [--world-size N] [--timeout S] [--lesson-timeout S]
                          [--require-all]

PATH is a class folder (one folder of notebooks per student), one student's folder, or
notebooks named one by one. Each student's lessons are graded against the instructor's
notebooks (`notebooks/` of this repository), never against the student's own: the list of
exercises, every check, the hidden checks and the lesson's own cells come from the
instructor's copy; from the student's notebook come only the answers (the cells tagged
`solution`, matched by cell id) and the cells the student added that an answer needs. A
check cell the student changed or deleted is reported, and the instructor's runs. Only the
cells the exercises need are executed (not every experiment of the lesson), each in a
wrapper that records its outcome, so that one failing cell costs nothing but itself.
Before each check, the course's files that a student's code changed (`tools/`, the
harnesses in `ddp_scripts/`) are put back.

Each student is graded by a process of its own (in a session of its own, its processes
under the limits of tools/sandbox.py), so that a student's code that kills it stops that
student's grading only; after each student the instructor's course files and the clean
copy are compared with their state before grading, and put back. Every check runs in the
judge (tools/judge.py), a process forked before any of the student's code runs, while the
student's kernel waits where the check was: an answer cannot rebind what a check calls,
and a hidden check's source never enters the student's process. A check of a script exercise
launches the student's script; a check of a function exercise calls the student's
functions in their kernel, which answers the judge's calls as data (tools/oracle.py).
In lessons that build hosts (32, 34), the judge takes the values of the experiments on
them from the kernel, as data, instead of running them again.
With two or more students, the lessons' experiments run once, with the instructor's
notebooks, and their values (JSON, decoded as data) reach every student from memory.

Writes to --out: `gradebook.csv` (one row per part of an exercise: student, lesson,
exercise, part, points, status, message, seconds), `totals.csv` (one line per student),
`report.md` (tampering noted, and how the class did per part) and
`feedback/<student>.html` as each student finishes, `students/<student>.json` (a run
again into the same --out keeps a student graded with the same notebooks; --fresh grades
again), and the executed notebooks; prints a line per part and a table, student by lesson. A lesson
missing from a student's folder scores 0 and is named; one that cannot run here (lesson
12 without root) is `not graded` and says why.

Inside a handout (`make student`), with no instructor's copy, `make test` runs this on the
learner's own notebooks: a self-check with the visible checks only, which exits 1 while a
check fails.

Exit status: 0 once everything was graded, whatever the score; 1 with `--require-all`
when a part did not pass; 2 when the grader itself could not run.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tools import course, grade_kernel, sandbox
from tools.course import (
    CELL_TIMEOUT_S,
    DEFAULT_WORLD_SIZE,
    REPO,
    execute,
    lessons,
    make_workspace,
    share_warm_server,
    uses_cluster,
    why_not_here,
)
from tools.exercises import (
    BEGIN,
    SOLUTION,
    WRITEFILE,
    exercise_list,
    points,
    stub_source,
    student_version,
    tags,
    written_scripts,
)
from tools.grade_cells import launches, names, needed_cells
from tools.oracle import ENDED, JUDGED, STOPPED


def cell_backstop() -> float:
    """Papermill's per-cell timeout as tools/course.execute sets it."""
    from tools.launch import timeout_scale
    return course.CELL_TIMEOUT_S * timeout_scale()


# Above every launch timeout a check uses (120 s at most), below papermill's backstop.
EXERCISE_TIMEOUT_S = CELL_TIMEOUT_S // 2
LESSON_TIMEOUT_S = 600  # a lesson's exercises take seconds; stubs wait for launch timeouts
MARKER = "DDP_GRADE_RUN"  # in the environment of every process a graded lesson starts
PROTECTED = ("tools", "ddp_scripts")
# A lesson cell that grading must run though no exercise reads what it assigns (lesson 32's
# `seconds = cluster.up()`, and `cluster.down()` after the exercises).
GRADE_SETUP = "grade-setup"  # put back before each check if a student changed them
# an experiment whose files (not only its values) later cells read: it runs for every
# student, its values never kept from the instructor's run (lesson 25's flight recorder)
GRADE_UNSHARED = "grade-unshared"


@dataclass
class Part:
    exercise: int
    name: str  # what the student writes: a function or a script
    part: str  # "check", or "hidden 1", "hidden 2"...
    points: float
    status: str = "not run"  # passed, failed, not run, missing, not graded
    message: str = ""
    detail: str = ""
    seconds: float = 0.0

    @property
    def scored(self) -> float:
        return self.points if self.status == "passed" else 0.0


@dataclass
class LessonGrade:
    name: str
    parts: list[Part]
    status: str = "graded"  # graded, missing, not graded
    notes: list[str] = field(default_factory=list)  # tampering, failed cells, a file's name
    stopped: str = ""
    seconds: float = 0.0

    @property
    def scored(self) -> float:
        return sum(p.scored for p in self.parts)

    @property
    def total(self) -> float:
        return sum(p.points for p in self.parts)


# The notebook a graded lesson runs ---------------------------------------------------------

@dataclass
class Plan:
    notebook: object  # the notebook papermill runs
    parts: list[Part]
    notes: list[str]
    own_files: tuple  # the scripts the student's answers write
    untouched: set = field(default_factory=set)  # exercises answered with the stub as it is
    # the judge's cells (tools/judge.py): the lesson's cells the exercises' checks need,
    # and those checks; a "parameters" cell is followed by the run's world_size
    judged: list = field(default_factory=list)  # (kind, source)
    judged_exercises: set = field(default_factory=set)


def normalized(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def match_solutions(teacher, student, exercises, notes: list | None = None) -> dict[int, object]:
    """The student's answer cell for each exercise: the cell with the same id (a lost
    `solution` tag is noted); but where that cell is still the handout's starting code, or
    is gone, a cell of the student's own (another id: copied, pasted, or a notebook whose
    ids all changed) that defines what the answer defines (its names, or the script it
    writes) and is not the starting code, noted; else the student's unmatched cells tagged
    `solution`, in order."""
    notes = [] if notes is None else notes
    by_id = {cell.get("id"): cell for cell in student.cells}
    teacher_ids = {cell.get("id") for cell in teacher.cells}
    found, used = {}, set()
    for ex in exercises:
        cell = by_id.get(teacher.cells[ex.solution].get("id"))
        if cell is not None and cell.cell_type == "code":
            if SOLUTION not in tags(cell):
                notes.append(f"exercise {ex.number}: its answer cell lost its `solution` tag "
                             f"(graded as the answer all the same)")
            found[ex.number] = cell
            used.add(id(cell))
    position = {id(cell): k for k, cell in enumerate(student.cells, start=1)}
    for ex in exercises:
        source = teacher.cells[ex.solution].source
        stub = normalized(stub_source(source)) if BEGIN in source else None
        current = found.get(ex.number)
        if current is not None and normalized(current.source) != stub:
            continue
        own = [c for c in student.cells if c.cell_type == "code" and id(c) not in used
               and c.get("id") not in teacher_ids and _defines(c.source, source)]
        written = [c for c in own if normalized(c.source) != stub]
        pick = (written or (own if current is None else []) or [None])[-1]
        if pick is None:
            continue
        if current is not None:
            used.discard(id(current))
            notes.append(f"exercise {ex.number}: graded your cell {position[id(pick)]}, which "
                         f"defines its answer; the exercise's own cell still holds the "
                         f"starting code")
        else:
            notes.append(f"exercise {ex.number}: its answer cell was not found by its id; "
                         f"graded your cell {position[id(pick)]}, which defines its answer")
        found[ex.number] = pick
        used.add(id(pick))
    spare = [c for c in student.cells if SOLUTION in tags(c) and id(c) not in used]
    for ex in exercises:
        if ex.number not in found and spare:
            found[ex.number] = spare.pop(0)
    return found


def _defines(source: str, answer: str) -> bool:
    """Whether a cell defines what an instructor's answer defines: the same script
    (`%%writefile` target), or every name the answer assigns."""
    target, mine = WRITEFILE.match(answer), WRITEFILE.match(source)
    if target:
        return bool(mine) and mine.group(2) == target.group(2)
    wanted = names(answer)[0]
    return bool(wanted) and not mine and wanted <= names(source)[0]


def plan_lesson(teacher, student, setup_source: str, stem: str = "lesson",
                judge: bool = False, not_judged: frozenset = frozenset()) -> Plan:
    """The notebook to execute: the instructor's cells that the exercises need, the
    student's answers, and the student's own added cells that an answer needs. `judge`:
    the exercises' checks go to the judge's cells instead (`Plan.judged`)."""
    exercises = exercise_list(teacher, strict=False)
    judged = {ex.number for ex in exercises if judge and ex.number not in not_judged}
    notes = []
    answers = match_solutions(teacher, student, exercises, notes)
    teacher_ids = {cell.get("id") for cell in teacher.cells}
    student_by_id = {cell.get("id"): cell for cell in student.cells}
    own_tagged = sorted({t for c in student.cells if c.get("id") not in teacher_ids
                         and id(c) not in {id(a) for a in answers.values()}
                         for t in tags(c) if t in ("check", "hidden", SOLUTION)})
    if own_tagged:
        notes.append("tags on your own cells change nothing (" + ", ".join(
            f"`{t}`" for t in own_tagged) + "): the instructor's checks ran")

    # the instructor's cells in order, with the student's added cells after the cell
    # (of the instructor's) that they follow in the student's notebook
    grading_only = {j for ex in exercises for j in ex.hidden + ex.near_misses}
    added_after: dict[str | None, list] = {}
    anchor = None
    for position, cell in enumerate(student.cells, start=1):
        if cell.get("id") in teacher_ids:
            anchor = cell.get("id")
        elif cell.cell_type == "code" and SOLUTION not in tags(cell) \
                and id(cell) not in {id(c) for c in answers.values()}:
            added_after.setdefault(anchor, []).append((position, cell))
    sequence = []  # (kind, teacher index or None, source, exercise or cell)
    for position, cell in added_after.get(None, []):
        sequence.append(("added", None, cell.source, position))
    role = {}
    for ex in exercises:
        role[ex.solution] = ("solution", ex)
        for j in ex.checks:
            role[j] = ("check", ex)
    for index, cell in enumerate(teacher.cells):
        if index in grading_only:
            continue
        if cell.cell_type == "code":
            kind, ex = role.get(index, ("lesson", None))
            if "parameters" in tags(cell):
                kind = "parameters"
            if kind == "solution":
                answer = answers.get(ex.number)
                sequence.append((kind, index, answer.source if answer else None, ex))
            elif kind != "check" or index == ex.checks[-1]:  # the visible checks as one
                if kind == "check" and ex.number in judged:
                    kind = "judged"
                sequence.append((kind, index, cell.source, ex))
        for position, added in added_after.get(cell.get("id"), []):
            sequence.append(("added", None, added.source, position))

    # what runs: the parameters, the exercises, the pieces of the scripts that answers
    # write, and whatever they need
    sources = [s or "" for _, _, s, _ in sequence]
    required = {k for k, (kind, index, *_) in enumerate(sequence)
                if kind in ("solution", "check", "parameters")
                or (index is not None and GRADE_SETUP in tags(teacher.cells[index]))}
    targets = {m.group(2) for kind, _, source, _ in sequence
               if kind == "solution" and (m := WRITEFILE.match(source or ""))}
    # every script the lesson writes (it costs nothing, and a needed cell may run it)
    required |= {k for k, (_, _, source, _) in enumerate(sequence)
                 if WRITEFILE.match(source or "")}
    # The lesson's cells and checks are served by the lesson's cells alone; a cell the
    # student added runs only when one of their answers reads what it assigns.
    # The judged checks do not run in the kernel; in a lesson that builds hosts, the
    # kernel runs the experiments they read, whose values the judge takes from it
    # (`_experiments_on_hosts`).
    on_hosts = uses_cluster(teacher)

    def judged_reads(ex) -> str:
        return "\n".join(teacher.cells[j].source for j in ex.checks + ex.hidden)

    lesson_only = ["" if kind == "added" or (kind == "judged" and not on_hosts) else
                   judged_reads(ex) if kind == "judged" else source
                   for (kind, _, _, ex), source in zip(sequence, sources)]
    if on_hosts:
        required |= {k for k, (kind, *_) in enumerate(sequence) if kind == "judged"}
    in_kernel = ["" if kind == "judged" else source
                 for (kind, *_), source in zip(sequence, sources)]
    run = needed_cells(lesson_only, required)
    run |= needed_cells(in_kernel, {k for k, (kind, *_) in enumerate(sequence)
                                    if kind == "solution"}, setup=False)
    found = [names(source) for source in sources]
    needed_here = set()  # exercises whose check assigns what only it gives a kernel cell
    for k in run:
        for name in found[k][2]:
            givers = [j for j in range(k) if name in found[j][0]]
            if givers and sequence[givers[-1]][0] == "judged" \
                    and not any(j in run for j in givers):
                needed_here.add(sequence[givers[-1]][3].number)
    if needed_here:  # a cell of the kernel reads what such a check assigns: checked there
        return plan_lesson(teacher, student, setup_source, stem, judge,
                           not_judged | needed_here)
    # a lesson's experiment that needs no answer gives every student the same values
    answers_and_added = {k for k, (kind, *_) in enumerate(sequence)
                         if kind in ("solution", "added")}
    shared = {k for k in run if sequence[k][0] == "lesson" and launches(sources[k])
              and not WRITEFILE.match(sources[k])
              and GRADE_UNSHARED not in tags(teacher.cells[sequence[k][1]])
              and not (needed_cells(sources, {k}, setup=False) & answers_and_added)}

    cells = [_code(setup_source, None)]
    for k, (kind, index, source, owner) in enumerate(sequence):
        if kind == "judged":  # the kernel waits here while the judge checks (and answers
            _note_tampering(teacher, student_by_id, owner, notes)  # its calls)
            cells.append(_code(f"__grader__.serve({owner.number})", index))
            continue
        if k not in run:
            continue
        if kind == "parameters":  # as it is: papermill sets world_size after it
            cell = _code(source, index)
            cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
        elif kind == "solution" and source is None:
            notes.append(f"exercise {owner.number}: its answer cell is missing (deleted?)")
            cells.append(_code(f"__grader__.missing({owner.number}, 'no answer: the cell "
                               f"of exercise {owner.number} ({owner.name}) is not in the "
                               f"notebook')", index))
        elif kind == "solution":
            cells.append(_code(f"__grader__.solution({owner.number}, {source!r})", index))
        elif kind == "check":
            _note_tampering(teacher, student_by_id, owner, notes)
            cells += _check_calls(teacher, owner, index)
        else:
            label = f"your cell {owner}" if kind == "added" else f"lesson cell {index + 1}"
            extra = _kept_as(stem, index, source, [sources[j] for j in run if j > k]) \
                if k in shared else ""
            cells.append(_code(f"__grader__.cell({label!r}, {source!r}{extra})", index))
    judge_cells = _judge_cells(teacher, sequence, sources, stem) if judged else []
    for kind, index, source, owner in sequence:  # what the student's code reaches for
        if kind == "solution" and source:
            where = f"exercise {owner.number}'s answer"
            found = suspicious(source, teacher.cells[index].source)
        elif kind == "added":
            where, found = f"your cell {owner}", suspicious(source)
        else:
            continue
        notes += [f"your code {what} ({where})" for what in found]
    nb = copy.deepcopy(teacher)
    nb.cells = cells
    untouched = {ex.number for ex in exercises  # (a self-check's "teacher" has no solution)
                 if ex.number in answers and BEGIN in teacher.cells[ex.solution].source
                 and normalized(answers[ex.number].source)
                 == normalized(stub_source(teacher.cells[ex.solution].source))}
    return Plan(nb, _parts_of(teacher), notes, tuple(sorted(Path(t).name for t in targets)),
                untouched, judge_cells, judged)


def _check_calls(teacher, ex, index) -> list:
    """The grader's calls that run exercise `ex`'s visible check, then its hidden ones."""
    visible = "\n".join(teacher.cells[j].source for j in ex.checks)
    cells = [_code(f"__grader__.part({ex.number}, 0, {visible!r})", index)]
    for h, j in enumerate(ex.hidden, start=1):
        cells.append(_code(f"__grader__.part({ex.number}, {h}, "
                           f"{teacher.cells[j].source!r}, {visible!r})", j))
    return cells


def _judge_cells(teacher, sequence, sources, stem) -> list:
    """The judge's cells: the lesson's own cells that the judged checks need (no cell of the
    student's, no script written again: the student's kernel wrote them), then the checks."""
    lesson = ["" if kind in ("added", "solution", "check") or WRITEFILE.match(source)
              or (index is not None and GRADE_SETUP in tags(teacher.cells[index])) else source
              for (kind, index, *_), source in zip(sequence, sources)]
    required = {k for k, (kind, *_) in enumerate(sequence) if kind in ("judged", "parameters")}
    run = {k for k in needed_cells(lesson, required) if lesson[k]}
    from_kernel = _experiments_on_hosts(teacher, sequence, lesson, run)
    run -= from_kernel.pop("cells")
    cells = []
    for k in sorted(run):
        kind, index, source, owner = sequence[k]
        if kind == "parameters":
            cells.append(("parameters", source))
        elif kind == "judged":
            # once the kernel waits here: a function exercise's names, from the kernel (the
            # answer's imports and the names it assigns, never its source)
            imports, assigned = answer_names(teacher.cells[owner.solution].source)
            assigned += from_kernel.get(owner.number, [])
            cells.append(("bind", f"__oracle__.bind(globals(), {imports!r}, {assigned!r}, "
                                  f"{owner.number})"))
            cells += [("check", c.source) for c in _check_calls(teacher, owner, index)]
        else:  # an experiment keeps its values for the next students, as in the kernel
            extra = ""
            if launches(source) and GRADE_UNSHARED not in tags(teacher.cells[index]):
                extra = _kept_as(stem, index, source, [lesson[j] for j in run if j > k])
            cells.append(("lesson", f"__grader__.cell({f'lesson cell {index + 1}'!r}, "
                                    f"{source!r}{extra})"))
    return cells


def _experiments_on_hosts(teacher, sequence, lesson, run) -> dict:
    """In a lesson that builds hosts (32, 34), the judge does not run the lesson's
    experiments on them again: the hosts are the kernel's, and in use. Its cells that
    launch, and those that read what such a cell assigns, are left out ("cells"); the
    values the checks read from them come from the student's kernel as data (tools/oracle.py),
    as observed there, each bound at the first exercise that reads it ({number: names}).
    A student's code could change them there, and pass a visible check that compares an
    answer with a measurement; a hidden check computes its own values."""
    if not uses_cluster(teacher):
        return {"cells": set()}
    found = [names(source) for source in lesson]
    left_out, made = set(), set()
    for k in sorted(run):
        if sequence[k][0] == "lesson" and (launches(lesson[k]) or found[k][2] & made):
            left_out.add(k)
            made |= found[k][0] | found[k][1]
    taken, bound = set(), {"cells": left_out}
    for k in sorted(run):
        kind, index, _, owner = sequence[k]
        if kind != "judged":
            continue
        read = set()
        for check in [teacher.cells[j].source for j in owner.checks + owner.hidden]:
            read |= names(check)[2]
        wanted = sorted((read & made) - taken)
        taken |= set(wanted)
        if wanted:
            bound[owner.number] = wanted
    return bound


def answer_names(answer: str) -> tuple[str, list]:
    """A function exercise's answer as the judge binds it: its import lines, and the other
    names it assigns (a script exercise's: nothing)."""
    if WRITEFILE.match(answer):
        return "", []
    tree = ast.parse(answer)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imported = {(a.asname or a.name).split(".")[0] for n in imports for a in n.names}
    return ("\n".join(ast.get_source_segment(answer, n) for n in imports),
            sorted(names(answer)[0] - imported))


def _kept_as(stem: str, index: int, source: str, later: list) -> str:
    """The arguments that keep an experiment's values for the next students: its key, and
    what it assigns that a later cell reads (not its figure)."""
    read_later = set().union(*(names(s)[2] for s in later))
    return f", {f'{stem}-{index}'!r}, {tuple(sorted(names(source)[0] & read_later))!r}"


def _code(source: str, index):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["grade_cell"] = index
    return cell


def _note_tampering(teacher, student_by_id, ex, notes) -> None:
    for j in ex.checks:
        mine = student_by_id.get(teacher.cells[j].get("id"))
        if mine is None:
            notes.append(f"exercise {ex.number}: its check cell was deleted; the instructor's "
                         f"check ran")
        elif "check" not in tags(mine):
            notes.append(f"exercise {ex.number}: its check cell lost its `check` tag; the "
                         f"instructor's check ran")
        elif normalized(mine.source) != normalized(teacher.cells[j].source):
            notes.append(f"exercise {ex.number}: its check cell was changed; the "
                         f"instructor's check ran")


# What a student's code reaches for, read from its source (the report's "tampering found")
SUSPICIOUS = (
    (r"__grader__|grade_kernel|KernelGrader|tools\.grade\b", "uses the grader's own code "
     "(`__grader__`, tools/grade_kernel.py)"),
    (r"\bbuiltins\b|__builtins__", "reaches `builtins`"),
    (r"\bAssertionError\s*=[^=]", "rebinds `AssertionError`"),
    (r"\bos\.kill\b|\bkillpg\b|\bpthread_kill\b|\bpkill\b|\bkillall\b|signal\.SIGKILL",
     "sends signals to processes"),
    (r"/proc\b|\bpsutil\b", "reads other processes (/proc)"),
    (r"\bsys\.modules\b|\bgc\.get_(?:referrers|objects)\b|\bctypes\b|\bsys\._getframe\b"
     r"|\binspect\.(?:currentframe|stack)\b", "reaches into the interpreter"),
    (r"\bsysconfig\b|site-packages|\.pth\b|sitecustomize", "touches Python's start-up files"),
    (r"(?<![\w.])\.\.(?=[/\\'\"])|\.parents\[", "uses a path out of its folder (`..`, "
     "`.parents[...]`)"),
)


def suspicious(source: str, instructors: str = "") -> list[str]:
    """What `source` (a student's code) reaches for that the instructor's answer to the
    same exercise does not: a reading of the source, for the instructor to look at (it
    proves nothing, and a determined cheat can hide from it; the grader's defences do not
    rely on it). A `%%writefile` line is the lesson's own."""
    def body(text):
        return "\n".join(line for line in (text or "").splitlines()
                         if not line.startswith("%%writefile"))
    mine, theirs = body(source), body(instructors)
    return [what for pattern, what in SUSPICIOUS
            if re.search(pattern, mine) and not re.search(pattern, theirs)]


# Running one lesson ------------------------------------------------------------------------

def grade_lesson(teacher_path: Path, student_path: Path, course: Path, pristine: Path,
                 protected: dict, out_dir: Path, world_size: int = DEFAULT_WORLD_SIZE,
                 timeout: float = EXERCISE_TIMEOUT_S,
                 lesson_timeout: float = LESSON_TIMEOUT_S,
                 cache: Path | None = None, write_cache: bool = False,
                 judge=None) -> LessonGrade:
    """Execute one student's lesson in `course` (a stubbed copy of the course) and grade
    it. Raises only when the grader cannot run (an unreadable instructor's notebook, a
    kernel that never starts). Whatever the lesson started is killed before it returns."""
    teacher = read_teacher(teacher_path)
    stem = teacher_path.stem
    try:
        student = nbformat.read(student_path, as_version=4)
    except Exception as error:  # noqa: BLE001 (a student's file: say what is wrong with it)
        grade = LessonGrade(stem, _parts_of(teacher), notes=[
            f"{student_path.name} is not a notebook that can be read: "
            f"{type(error).__name__}: {str(error)[:120]}"])
        for p in grade.parts:
            p.status, p.message = "failed", "the notebook could not be read"
        return grade
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / f"{stem}.results.jsonl"
    for stale in (results, results.with_suffix(".running"), out_dir / f"{stem}.ipynb"):
        stale.unlink(missing_ok=True)
    setup = ("import sys as _sys\n"
             f"_sys.path.insert(0, {str(course)!r})\n"
             "from tools.grade_kernel import KernelGrader as _KernelGrader  # noqa: E402\n\n")
    plan = plan_lesson(teacher, student, "", stem, judge=judge is not None)
    setup += (f"__grader__ = _KernelGrader({str(results)!r}, {timeout!r}, {lesson_timeout!r},"
              f" {str(course)!r}, {str(pristine)!r}, {protected!r}, {plan.own_files!r}, "
              f"{str(cache or '')!r}, {cell_backstop()!r}, {write_cache!r})\n"
              "del _sys, _KernelGrader")
    plan.notebook.cells[0].source = setup
    # where the kernel answers the judge's calls (tools/oracle.py), and says it has ended
    oracle = Path(tempfile.mkdtemp(prefix="ddp-oracle-")) if plan.judged else None
    if oracle:
        plan.notebook.cells[0].source += f"\n__grader__.oracle = {str(oracle)!r}"
    start = time.monotonic()
    stopped = ""
    # the warm server that this student's lessons share, started before the marker that
    # kills what a lesson leaves: one start for all its lessons, not one per lesson
    share_warm_server()
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    saved = os.environ.get(MARKER)
    os.environ[MARKER] = mark
    executed = out_dir / f"{stem}.ipynb"
    failure: list = []

    def kernel():
        try:
            execute(plan.notebook, executed, course, world_size=world_size)
        except Exception as error:  # noqa: BLE001 (the lesson stopped: its time, a dead kernel)
            failure.append(error)
        finally:
            if oracle:
                (oracle / ENDED).touch()

    judged, judge_stopped = [], ""
    thread = threading.Thread(target=kernel, name=f"kernel {stem}", daemon=True)
    try:
        thread.start()
        if plan.judged:  # the checks, in a process where no student's code ran; it runs
            # while the kernel waits for it at each exercise, and once it has ended
            judged, judge_stopped = run_judge(judge, plan, world_size, timeout, lesson_timeout,
                                              course, pristine, protected, cache, write_cache,
                                              oracle)
            (oracle / JUDGED).touch()  # a kernel still waiting for the judge goes on
        thread.join()
    finally:
        if saved is None:
            del os.environ[MARKER]
        else:
            os.environ[MARKER] = saved
        kill_marked(mark)
        if oracle:
            shutil.rmtree(oracle, ignore_errors=True)
    if failure:
        stopped = _why_it_stopped(failure[0], results.with_suffix(".running"))
    if not stopped:  # what was running, kept only to say where a lesson stopped
        results.with_suffix(".running").unlink(missing_ok=True)
    without_hidden_sources(out_dir)
    grade = LessonGrade(stem, plan.parts, notes=list(plan.notes), stopped=stopped,
                        seconds=time.monotonic() - start)
    entries = _fill(grade, results, stopped)
    if plan.judged:
        _fill_judged(grade, entries, judged, judge_stopped, plan.judged_exercises)
        with results.open("a") as record:  # the judge's results too, as the kernel's
            record.writelines(json.dumps(e) + "\n" for e in judged)
    for part in grade.parts:  # say it: the answer is the handout's starting code
        if part.exercise in plan.untouched and part.status == "failed" \
                and part.part == "check":
            part.message = f"not attempted (the handout's starting code): {part.message}"
    return grade


HIDDEN_PART = re.compile(r"^__grader__\.part\((\d+), ([1-9]\d*), ")


OUTPUT_CHARS = 100_000  # of a cell's outputs kept in an executed notebook


def without_hidden_sources(folder: Path) -> None:
    """The executed notebooks in `folder`, which may go back to the student, with each
    hidden check's source replaced by a line that names it (its outcome stays), and each
    cell's outputs cut to OUTPUT_CHARS characters; the inputs papermill ran (hidden checks
    and all) removed."""
    for path in Path(folder).glob("*.input.ipynb"):
        path.unlink(missing_ok=True)
    for path in Path(folder).glob("*.ipynb"):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 (cut short: it cannot go back as it is)
            path.unlink(missing_ok=True)
            continue
        for cell in nb.cells:
            m = HIDDEN_PART.match(cell.source) if cell.cell_type == "code" else None
            if m:
                cell.source = f"# exercise {m[1]}, hidden check {m[2]}: its source is not shown"
            if cell.cell_type == "code":
                cell.outputs = capped_outputs(cell.outputs)
        nbformat.write(nb, path)


def capped_outputs(outputs: list, limit: int = OUTPUT_CHARS) -> list:
    """A cell's outputs within about `limit` characters: a long stream keeps its start and
    its end; outputs past the limit are replaced by one line that counts them."""
    kept, left = [], limit
    for k, output in enumerate(outputs):
        size = len(json.dumps(output))
        if size <= left:
            kept.append(output)
            left -= size
            continue
        if output.get("output_type") == "stream" and left > 1000:
            text = output.get("text", "")
            head, tail = (left - 200) * 4 // 5, (left - 200) // 5
            kept.append(nbformat.v4.new_output(
                "stream", name=output.get("name", "stdout"),
                text=f"{text[:head]}\n[... {len(text) - head - tail:,} characters left out "
                     f"...]\n{text[-tail:]}"))
            k += 1
        rest = outputs[k:]
        if rest:
            chars = sum(len(json.dumps(o)) for o in rest)
            kept.append(nbformat.v4.new_output(
                "stream", name="stdout",
                text=f"[{len(rest)} output(s), {chars:,} characters, left out]\n"))
        break
    return kept


def _parts_of(teacher) -> list[Part]:
    """Every part of every exercise: its visible check, then each hidden check."""
    parts = []
    for ex in exercise_list(teacher, strict=False):
        parts.append(Part(ex.number, ex.name, "check",
                          sum(points(teacher.cells[j]) for j in ex.checks)))
        parts += [Part(ex.number, ex.name, f"hidden {h}", points(teacher.cells[j]))
                  for h, j in enumerate(ex.hidden, start=1)]
    return parts


def _unrun(teacher: Path, status: str, message: str, note: str) -> LessonGrade:
    """A lesson graded without running: every part `status`, with `message`."""
    grade = LessonGrade(teacher.stem, _parts_of(read_teacher(teacher)),
                        status=status, notes=[note])
    for part in grade.parts:
        part.status, part.message = status, message
    return grade


def _fill(grade: LessonGrade, results: Path, stopped: str) -> list:
    """The parts from the kernel's results; returns those results."""
    entries = [json.loads(line) for line in results.read_text().splitlines()] \
        if results.exists() else []
    solution_failed = {e["exercise"]: e for e in entries
                       if e.get("stage") == "solution" and e["status"] == "failed"}
    by_part = {(e["exercise"], e["part"]): e for e in entries if e.get("stage") == "check"}
    for part in grade.parts:
        k = 0 if part.part == "check" else int(part.part.split()[1])
        entry = by_part.get((part.exercise, k))
        if entry is None:
            part.status = "not run"
            part.message = "the lesson stopped before it" if stopped else "no result recorded"
            continue
        part.status, part.message = entry["status"], entry["message"]
        part.detail, part.seconds = entry.get("detail", ""), entry["seconds"]
        failed = solution_failed.get(part.exercise)
        if failed and part.status == "failed" and failed["detail"]:
            part.detail = failed["detail"]
    for e in entries:
        if "cell" in e and e["status"] == "failed":
            grade.notes.append(f"{e['cell']} failed (not scored): {e['message']}")
    return entries


def run_judge(judge, plan, world_size, timeout, lesson_timeout, course, pristine, protected,
              cache, write_cache, oracle: Path) -> tuple[list, str]:
    """The judged cells of `plan`, run by `judge` (tools/judge.py) in the student's course,
    taking turns with the student's kernel in the folder `oracle` (tools/oracle.py): it
    starts once the kernel waits at the first exercise, or has ended. (The results, as the
    kernel's, and why the judge stopped or "".)"""
    first = min(plan.judged_exercises, default=None)
    # the judge's clock: its waits for the kernel do not count against the lesson's time
    setup = ("from tools.grade_kernel import KernelGrader as _KernelGrader\n"
             "from tools.oracle import Oracle as _Oracle\n"
             f"__oracle__ = _Oracle({str(oracle)!r}, {first!r}, {2 * lesson_timeout!r})\n"
             f"__grader__ = _KernelGrader(__judge_results__, {timeout!r}, "
             f"{2 * lesson_timeout + 60!r}, "
             f"{str(course)!r}, {str(pristine)!r}, {protected!r}, {plan.own_files!r}, "
             f"{repr(str(cache or '')) if write_cache else '__judge_cache__'}, None, "
             f"{write_cache!r}, '/dev/null')\n"  # what it runs is not written where

             "del _KernelGrader, _Oracle\n__grader__.restore()\n"
             "__grader__.check_slack = 5.0  # the kernel's own timer stops a call first")
    cells = [setup]
    for kind, source in plan.judged:
        cells.append(source)
        if kind == "parameters":  # as papermill does
            cells.append(f"world_size = {world_size!r}")
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    try:
        from tools import zygote
        shared = {zygote.SHARED: os.environ[zygote.SHARED]} if zygote.SHARED in os.environ \
            else {}  # the kernels' warm server, for the judge's launches too
        return judge.run({"cells": cells, "cwd": str(course / "notebooks"), "env": shared,
                          "marker_name": MARKER, "marker": mark}, 2 * lesson_timeout + 120)
    finally:
        kill_marked(mark)


def _fill_judged(grade: LessonGrade, kernel: list, judged: list, stopped: str,
                 exercises: set) -> None:
    """The judged exercises' parts from the judge's results; an answer that failed in the
    student's kernel (its results: `kernel`), or is missing, fails them as it would have
    there."""
    failed = {e["exercise"]: re.sub(r" \[raised in your code: [^\]]*\]$", "", e["message"])
              for e in kernel if e.get("stage") == "solution" and e["status"] == "failed"}
    by_part = {(e["exercise"], e["part"]): e for e in judged
               if e.get("stage") == "check" and e.get("exercise") in exercises}
    for part in grade.parts:
        if part.exercise not in exercises:
            continue  # checked in the kernel
        k = 0 if part.part == "check" else int(part.part.split()[1])
        entry = by_part.get((part.exercise, k))
        if part.exercise in failed:
            message = failed[part.exercise]
            part.status, part.message = "failed", (
                message if message.startswith("no answer") else
                f"not checked: the solution cell failed ({message})")
            part.detail, part.seconds = "", 0.0
        elif entry is None and grade.stopped:
            part.status, part.message = "not run", "the lesson stopped before it"
        elif entry is None:
            part.status = "not run"
            part.message = stopped or "no result recorded by the judge"
        elif grade.stopped and STOPPED in entry["message"]:
            part.status, part.message = "not run", "the lesson stopped before it"
        else:
            part.status, part.message = entry["status"], entry["message"]
            part.detail, part.seconds = entry.get("detail", ""), entry["seconds"]
    for e in judged:
        if "cell" in e and e["status"] == "failed":
            grade.notes.append(f"{e['cell']} failed in the judge (not scored): {e['message']}")
    if stopped:
        grade.notes.append(stopped)


def _why_it_stopped(error: Exception, running: Path) -> str:
    name = getattr(error, "ename", None) or type(error).__name__
    value = getattr(error, "evalue", None)
    if value is None:
        value = str(error).strip().splitlines()[0] if str(error).strip() else ""
    doing = running.read_text().strip() if running.exists() else ""
    where = f" (in {doing})" if doing else ""
    if name == "KeyboardInterrupt":  # papermill's backstop interrupted the kernel
        name, value = "CellTimeoutError", f"a cell ran past the {course.CELL_TIMEOUT_S} s backstop"
    return (f"{name}: {value}" if value else name) + where


def marked_processes(mark: str) -> list[int]:
    """The processes whose environment carries MARKER=mark (Linux: /proc; elsewhere none,
    and the kernel's own clean-up after a timeout is what remains)."""
    needle = f"{MARKER}={mark}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            pass
    return [pid for pid in found if pid != os.getpid()]


def kill_marked(mark: str) -> None:
    for pid in marked_processes(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# A student, a class ------------------------------------------------------------------------

def graded_lessons(teacher_dir: Path, chosen: list[str] | None = None) -> list[Path]:
    found = [p for p in sorted(teacher_dir.glob("[0-9][0-9]_*.ipynb"))
             if exercise_list(nbformat.read(p, as_version=4), strict=False)]
    if chosen:
        unknown = set(chosen) - {p.stem for p in found}
        if unknown:
            raise FileNotFoundError(f"no lesson with exercises named {', '.join(sorted(unknown))}"
                                    f" in {teacher_dir}")
        found = [p for p in found if p.stem in chosen]
    return found


def hand_ins(folder: Path, stems: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The student's notebook for each lesson, and notes on the files around them: a
    lesson found under another name (`Copy of 13_inside_ddp.ipynb`) is graded and named; a
    notebook that is no lesson is named and ignored."""
    files = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    found, notes = {}, []
    for path in files:
        if path.stem in stems and path.stem not in found:
            found[path.stem] = path
    for path in files:
        if path in found.values():
            continue
        guesses = [s for s in stems if s in path.stem and s not in found]
        if guesses:
            stem = max(guesses, key=len)
            found[stem] = path
            notes.append(f"{path.relative_to(folder)} was graded as {stem} (name it "
                         f"{stem}.ipynb)")
        else:
            notes.append(f"{path.relative_to(folder)} is not a lesson of this course: ignored")
    return found, notes


def prepare_course(build: Path, teacher_lessons: list[Path]) -> tuple[Path, dict]:
    """The course as students have it (answers stubbed) in `build/pristine`, and the
    sha256 of every file in its `tools/` and `ddp_scripts/` that no answer writes."""
    from tools.student import write_stubbed_scripts

    pristine = make_workspace(build / "pristine")
    answers = set()
    for path in lessons():
        nb = nbformat.read(path, as_version=4)
        write_stubbed_scripts(student_version(nb), pristine / "notebooks", pristine)
        for target, (_, cells) in written_scripts(nb, pristine / "notebooks").items():
            if any(SOLUTION in tags(c) for c in cells):
                answers.add(target.resolve())
    protected = {}
    for part in PROTECTED:
        for path in sorted((pristine / part).rglob("*")):
            if path.is_file() and path.resolve() not in answers \
                    and "__pycache__" not in path.parts:
                protected[str(path.relative_to(pristine))] = hashlib.sha256(
                    path.read_bytes()).hexdigest()
    return pristine, protected


def grade_student(name: str, notebooks: dict[str, Path], teacher_lessons: list[Path],
                  pristine: Path, protected: dict, out: Path, args, notes=(),
                  cache: Path | None = None, write_cache: bool = False, judge=None) -> list:
    """`cache`: the instructor's run writes the values of the lessons' experiments there
    (`write_cache`); a student's run reads them there."""
    course = out / "work" / _safe(name)
    _empty(course)  # (in a student's view, a folder of its own: emptied, not removed)
    shutil.copytree(pristine, course, dirs_exist_ok=True)
    grades = []
    try:
        for teacher in teacher_lessons:
            stem = teacher.stem
            reason = why_not_here(teacher, read_teacher(teacher))
            if stem not in notebooks:
                grade = _unrun(teacher, "missing", f"{stem}.ipynb was not handed in",
                               f"{stem}.ipynb was not handed in")
            elif reason:
                grade = _unrun(teacher, "not graded", "needs Linux and root here",
                               f"not graded on this machine: {reason}; grade it where it "
                               f"runs (Linux, as root)")
            else:
                grade = grade_lesson(teacher, notebooks[stem], course, pristine, protected,
                                     out / "executed" / _safe(name), args.world_size,
                                     args.timeout, args.lesson_timeout, cache, write_cache,
                                     judge)
            if stem == teacher_lessons[0].stem:
                grade.notes = list(notes) + grade.notes
            grades.append(grade)
            from tools.gradebook import print_lesson
            print_lesson(name, grade)
    finally:
        _empty(course)
    return grades


def _empty(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name) or "student"


def students(paths: list[Path], stems: list[str]) -> list[tuple[str, dict, list]]:
    """(student, {lesson: notebook}, notes) for each student the paths name."""
    found = []
    loose = [p for p in paths if p.is_file()]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if path.is_file() and path.suffix != ".ipynb":
            raise FileNotFoundError(f"{path}: not a notebook (.ipynb) or a folder")
    if loose:  # notebooks named one by one: one student, those lessons only
        by_stem = {p.stem: p for p in loose}
        found.append((loose[0].parent.name or "notebooks", by_stem, []))
    for path in paths:
        if not path.is_dir():
            continue
        if any(path.glob("*.ipynb")):
            notebooks, notes = hand_ins(path, stems)
            found.append((path.name, notebooks, notes))
        else:
            folders = sorted(p for p in path.iterdir() if p.is_dir()
                             and not p.name.startswith("."))
            if not folders:
                raise FileNotFoundError(f"{path}: no notebooks and no student folders in it")
            for folder in folders:
                notebooks, notes = hand_ins(folder, stems)
                found.append((folder.name, notebooks, notes))
    return found


def default_paths() -> list[Path]:
    if (REPO / "tests").is_dir():  # the course repository: the handout's stubs
        return [REPO / "build" / "student" / "notebooks"]
    return [REPO / "notebooks"]  # a handout: the learner's own lessons


def main(argv=None) -> int:
    from tools import gradebook

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path,
                        help="a class folder, students' folders, or notebooks")
    parser.add_argument("--lessons", default="",
                        help="comma-separated lessons to grade (default: all with exercises)")
    parser.add_argument("--teacher", type=Path, default=None,
                        help="the instructor's notebooks (default: notebooks/ of the course;"
                             " in a handout, the learner's own: a self-check)")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "grades")
    parser.add_argument("--shard", default="1/1",
                        help="K/N: grade the K-th of N equal shares of the students (to "
                             "spread a class over N machines)")
    parser.add_argument("--world-size", type=int, default=DEFAULT_WORLD_SIZE)
    parser.add_argument("--timeout", type=float, default=EXERCISE_TIMEOUT_S,
                        help="seconds an answer or a check may run "
                             f"(default {EXERCISE_TIMEOUT_S})")
    parser.add_argument("--lesson-timeout", type=float, default=LESSON_TIMEOUT_S,
                        help=f"seconds a whole lesson may run (default {LESSON_TIMEOUT_S})")
    parser.add_argument("--require-all", action="store_true",
                        help="exit 1 unless every part of every exercise passed")
    parser.add_argument("--fresh", action="store_true",
                        help="grade every student again (by default a student graded by an "
                             "earlier run into the same --out, with the same notebooks, is "
                             "kept: a run that was stopped goes on where it stopped)")
    parser.add_argument("--one-student", type=Path, help=argparse.SUPPRESS)  # the child
    parser.add_argument("--result-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_student:
        return _one_student(args.one_student, args.result_fd)

    self_check = args.teacher is None and not (REPO / "tests").is_dir()
    try:
        k, n = (int(x) for x in args.shard.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        print(f"grade: --shard {args.shard}: expected K/N with 1 <= K <= N", file=sys.stderr)
        return 2
    paths = args.paths or default_paths()
    chosen = [s for s in args.lessons.split(",") if s]
    try:
        if self_check:
            return _self_check(paths, args)
        teacher_dir = args.teacher or (REPO / "notebooks")
        teacher_lessons = graded_lessons(teacher_dir, chosen)
        stems = [p.stem for p in teacher_lessons]
        class_ = students(paths, stems)
    except (FileNotFoundError, ValueError) as error:
        print(f"grade: {error}", file=sys.stderr)
        return 2
    if not class_:
        print("grade: no students found in " + ", ".join(map(str, paths)), file=sys.stderr)
        return 2
    class_ = class_[k - 1::n]
    out = args.out.resolve()  # the kernels run elsewhere: a relative path would move
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if n == 1 else f"-{k}-of-{n}"
    sandbox.remove_stale()
    # What a student's code could change for the students after it, as it is now: the
    # instructor's course, the start-up files of Python's site-packages, every hand-in
    course_files = Snapshot(REPO, COURSE_FOLDERS)
    site = Snapshot(Path(sysconfig.get_paths()["purelib"]), SITE_FILES)
    from tools import zygote  # its compiled helper, which every warm launch loads: built
    try:  # now, if it is not yet, so that a new one is never taken for a student's
        zygote.library()
    except RuntimeError:  # no compiler: launches start cold
        pass
    helpers = [Snapshot(folder, ("warm_fork-*.so",)) for folder in zygote._cache_folders()
               if folder.is_dir()]
    handed_in = {p: p.read_bytes() for _, notebooks, _ in class_ for p in notebooks.values()}
    pristine, protected = prepare_course(out / "work", teacher_lessons)
    pristine_digests = digests(pristine)
    gradebook_rows = {}

    def lessons_for(notebooks):
        if all(p.is_file() for p in paths):  # notebooks named one by one: those only
            return [t for t in teacher_lessons if t.stem in notebooks]
        return teacher_lessons

    try:
        # to grade now (not kept from an earlier run): two or more share the values of the
        # lessons' experiments, run once with the instructor's notebooks
        keys = {name: signature(notebooks, lessons_for(notebooks), args)
                for name, notebooks, _ in class_}
        kept_grades = {} if args.fresh else {name: load_kept(out, name, keys[name])
                                             for name, _, _ in class_}
        pending = [t for name, notebooks, _ in class_ for t in lessons_for(notebooks)
                   if t.stem in notebooks and kept_grades.get(name) is None]
        cache = {}
        if len(pending) > len(set(pending)):
            cache = reference_values(sorted(set(pending)), pristine, protected, out, args)
        for name, notebooks, notes in class_:
            if not notebooks and not notes:
                notes = ["no notebooks handed in"]
            notes = list(notes)
            lessons_here = lessons_for(notebooks)
            changed = [p for p in notebooks.values() if _read(p) != handed_in[p]]
            for path in changed:  # another student's code changed this hand-in
                path.write_bytes(handed_in[path])
            if changed:
                notes.append("your notebooks were changed by another student's code before "
                             "they were graded; graded as you handed them in")
            key, kept = keys[name], kept_grades.get(name)
            if kept is not None:
                print(f"# {name}: graded by an earlier run with the same notebooks, kept "
                      f"(--fresh grades again)", flush=True)
                gradebook_rows[name] = kept
            else:
                print(f"# {name}", flush=True)
                start = time.monotonic()
                grades, finished = grade_in_child(name, notebooks, lessons_here, pristine,
                                                  protected, out, args, notes, cache=cache,
                                                  hand_ins=tuple(handed_in))
                without_hidden_sources(out / "executed" / _safe(name))
                # what this student's code changed for the next ones, found and put back
                changed = course_files.restore() + site.restore() + [
                    c for helper in helpers for c in helper.restore()]
                remove_bytecode([REPO / part for part in COURSE_FOLDERS] + [pristine])
                if grades and changed:
                    grades[0].notes.append("your code changed the instructor's course (put "
                                           "back before the next student): "
                                           + ", ".join(changed[:8]))
                if digests(pristine) != pristine_digests:
                    if grades:
                        grades[0].notes.append("your code changed the clean copy of the "
                                               "course (made again before the next student)")
                    pristine, protected = prepare_course(out / "work", teacher_lessons)
                gradebook_rows[name] = (grades, time.monotonic() - start)
                if finished:  # a grading that was stopped is done again by the next run
                    save_kept(out, name, key, *gradebook_rows[name])
            gradebook.write_feedback(out / "feedback" / f"{_safe(name)}.html", name,
                                     gradebook_rows[name][0])
            gradebook.write_csv(out / f"gradebook{suffix}.csv", gradebook_rows)  # as it goes
            gradebook.write_totals(out / f"totals{suffix}.csv", gradebook_rows)
            gradebook.write_report(out / f"report{suffix}.md", gradebook_rows)
    finally:
        shutil.rmtree(out / "work", ignore_errors=True)
    print()
    print(gradebook.table(gradebook_rows, [p.stem for p in teacher_lessons]))
    print(f"\ngradebook: {out / f'gradebook{suffix}.csv'}; totals (for an LMS): "
          f"{out / f'totals{suffix}.csv'}; report: {out / f'report{suffix}.md'}; feedback: "
          f"{out / 'feedback'}/")
    view = ("; in a view of the files of its own (the course read-only, your notebooks, the "
            "other students' work and the gradebook hidden) and a process namespace of its own"
            if confining() else "; no view of its own (that needs root on Linux): it could "
            "read your notebooks and the other students' work")
    print(f"limits: {sandbox.Sandbox.make(f'probe-{os.getpid()}').describe_and_remove()}{view}")
    complete = all(p.status == "passed" for grades, _ in gradebook_rows.values()
                   for g in grades for p in g.parts if g.status != "not graded")
    return 1 if args.require_all and not complete else 0


# Each student in a process of its own; what is kept between runs ----------------------------

COURSE_FOLDERS = ("tools", "ddp_scripts", "notebooks")  # what graded code could change
SITE_FILES = ("*.pth", "sitecustomize.py", "usercustomize.py")  # run by every Python start


def _read(path: Path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _files(root: Path, patterns) -> list[Path]:
    """The files under `root` that match `patterns` (a folder: everything in it; a glob:
    the top level), links and other non-files included (they are reported, not
    followed), bytecode left out (remove_bytecode)."""
    found = []
    for pattern in patterns:
        base = root / pattern
        paths = [base, *base.rglob("*")] if base.is_dir() else list(root.glob(pattern))
        found += [p for p in paths if not p.is_dir() or p.is_symlink()]
    return sorted(p for p in found if "__pycache__" not in p.parts
                  and ".ipynb_checkpoints" not in p.parts)


def digests(folder: Path, parts=None) -> dict[str, str]:
    """sha256 of every file under `folder` (or its `parts`), by relative path; a link or
    an unreadable file by a mark of its own."""
    found = {}
    for path in _files(folder, parts or [""]):
        relative = str(path.relative_to(folder))
        if path.is_symlink() or not path.is_file():
            found[relative] = "not a file"
            continue
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            found[relative] = h.hexdigest()
        except OSError:
            found[relative] = "unreadable"
    return found


class Snapshot:
    """Files as they were when grading began, held in this process: `restore` puts back
    what a student's code changed, removes what it added (a link too), and names them."""

    def __init__(self, root: Path, patterns):
        self.root, self.patterns = root, patterns
        self.files = {str(p.relative_to(root)): p.read_bytes()
                      for p in _files(root, patterns) if p.is_file() and not p.is_symlink()}
        self.digests = {r: hashlib.sha256(b).hexdigest() for r, b in self.files.items()}

    def restore(self) -> list[str]:
        now = digests(self.root, self.patterns)
        changed = sorted(r for r in set(now) | set(self.digests)
                         if now.get(r) != self.digests.get(r))
        for relative in changed:
            target = self.root / relative
            try:
                if target.is_symlink() or target.is_file():
                    target.unlink()
                elif target.exists():
                    shutil.rmtree(target)
                if relative in self.files:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(self.files[relative])
            except OSError as error:
                print(f"grade: could not put back {target}: {error}", file=sys.stderr)
        return changed


def remove_bytecode(folders) -> None:
    """Every __pycache__ under `folders`: a .pyc a student's code planted there would run
    instead of its source in every later process."""
    for folder in folders:
        for cache in sorted(Path(folder).rglob("__pycache__"), reverse=True):
            shutil.rmtree(cache, ignore_errors=True)


def signature(notebooks: dict, lessons_here: list[Path], args) -> str:
    """What a student's grade depends on: their notebooks, the instructor's, the settings."""
    h = hashlib.sha256()
    for path in sorted(lessons_here) + [notebooks[s] for s in sorted(notebooks)]:
        h.update(str(path.name).encode() + b"\0" + Path(path).read_bytes())
    h.update(repr((args.world_size, args.timeout, args.lesson_timeout)).encode())
    return h.hexdigest()


def _kept_path(out: Path, name: str) -> Path:
    return out / "students" / f"{_safe(name)}.json"


def _to_json(grades) -> list:
    from dataclasses import asdict
    return [asdict(g) for g in grades]


def _from_json(data) -> list:
    return [LessonGrade(**{**g, "parts": [Part(**p) for p in g["parts"]]}) for g in data]


def save_kept(out: Path, name: str, key: str, grades, seconds: float) -> None:
    path = _kept_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"signature": key, "seconds": seconds,
                                     "grades": _to_json(grades)}))
    os.replace(temporary, path)


def load_kept(out: Path, name: str, key: str):
    try:
        data = json.loads(_kept_path(out, name).read_text())
        if data["signature"] == key:
            return _from_json(data["grades"]), float(data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def grade_in_child(name, notebooks, lessons_here, pristine, protected, out, args, notes,
                   reference: Path | None = None, cache: dict | None = None,
                   hand_ins: tuple = ()):
    """grade_student in a process of its own, in a session of its own and in the student's
    sandbox (tools/sandbox.py): a student's code that kills its parent, or the whole
    session, ends that process, not the class's run. Returns (grades, finished): the
    grades it sent back over a pipe of its own when it exited with status 0, else every
    part failed, saying why, and finished False. `reference`: the folder where the
    instructor's run writes its experiments' values; `cache`: those values, for a student's.
    As root, the process sees the files through a view of its own (`student_view`) and no
    process but its own (tools/sandbox.py, `confine`); `hand_ins`: every student's notebooks."""
    work = out / "work"
    job = work / f"{_safe(name)}.job.json"
    view = student_view(name, notebooks, out, reference, hand_ins) if confining() else None
    job.write_text(json.dumps({
        "name": name, "notebooks": {s: str(p) for s, p in notebooks.items()},
        "lessons": [str(p) for p in lessons_here], "pristine": str(pristine),
        "protected": protected, "out": str(out), "notes": list(notes),
        "world_size": args.world_size, "timeout": args.timeout,
        "lesson_timeout": args.lesson_timeout, "cell_timeout": course.CELL_TIMEOUT_S,
        "reference": str(reference or ""), "cache": cache or {}, "view": view}))
    limit = len(lessons_here) * (args.lesson_timeout + 120) + 120
    box = sandbox.Sandbox.make(f"{_safe(name)}-{os.getpid()}")
    reading, writing = os.pipe()
    from tools import zygote
    # not a warm server of this process (or of `make test`'s): what it forks runs outside
    # the student's view and control group. The grading process starts its own, in them.
    env = {k: v for k, v in os.environ.items() if k != zygote.SHARED}
    env.update({"PYTHONNOUSERSITE": "1",  # nothing from ~/.local, a fresh
                "IPYTHONDIR": str(work / f"{_safe(name)}.ipython")})  # IPython profile
    command = [sys.executable, "-m", "tools.grade", "--one-student", str(job),
               "--result-fd", str(writing)]
    child = subprocess.Popen(sandbox.confined_command(command) if view else command,
                             cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace",
                             pass_fds=(writing,), preexec_fn=box.enter, env=env)
    os.close(writing)
    sent = []
    relays = [threading.Thread(target=_relay, args=(stream, to), daemon=True)
              for stream, to in ((child.stdout, sys.stdout), (child.stderr, sys.stderr))]
    relays.append(threading.Thread(target=lambda: sent.append(_read_all(reading)),
                                   daemon=True))
    for relay in relays:
        relay.start()
    try:
        code = child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        child.wait()
        kill_marked_by(child.pid)
        box.remove()
        for folder in (work / _safe(name), work / f"{_safe(name)}.view"):  # (emptied by it)
            shutil.rmtree(folder, ignore_errors=True)
        for relay in relays:
            relay.join(timeout=10)
    if code == 0 and sent:
        try:  # the last line: what the grading process itself wrote last
            return _from_json(json.loads(sent[0].strip().splitlines()[-1])), True
        except (ValueError, KeyError, TypeError, IndexError):
            pass
    why = (f"ran past {limit:g} s" if code is None else
           f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
    grades = [_unrun(t, "failed", f"grading stopped: the grading process {why}",
                     f"grading stopped: the grading process {why} (your code may have "
                     f"stopped it)") for t in lessons_here]
    from tools.gradebook import print_lesson
    for teacher, grade in zip(lessons_here, grades):
        grade.status = "graded"
        try:  # what its code reaches for, read here: the grading process sent nothing
            student = nbformat.read(notebooks[teacher.stem], as_version=4)
            plan = plan_lesson(nbformat.read(teacher, as_version=4), student, "", teacher.stem)
            grade.notes += [n for n in plan.notes if n.startswith("your code ")]
        except Exception:  # noqa: BLE001 (unreadable, or not handed in: said elsewhere)
            pass
        print_lesson(name, grade)
    return grades, False


def confining() -> bool:
    """Whether each student is graded in a view of its own (root on Linux; tools/sandbox.py).
    DDP_GRADE_CONFINE=0 turns it off."""
    return os.environ.get("DDP_GRADE_CONFINE", "1") != "0" and sandbox.can_confine()


def student_view(name: str, notebooks: dict, out: Path, reference: Path | None,
                 hand_ins=()) -> dict:
    """What a student's grading process sees (tools/sandbox.py, `confine`), as JSON: the
    repository read-only, without the instructor's notebooks (shown: only the notebooks
    being graded, when they are the instructor's), its history or other builds; of the
    class's folders, only this student's notebooks, read-only; of --out, the clean copy
    (read-only) and this student's own course, IPython profile, executed notebooks and
    the instructor's run's values folder."""
    own = {str(Path(p).resolve()) for p in notebooks.values()}
    hidden: dict[str, dict[str, bool]] = {str(REPO / "notebooks"): {}, str(REPO / ".git"): {}}
    out = out.resolve()
    build = REPO / "build"
    if build.is_dir():
        for entry in build.iterdir():
            if entry.is_dir() and entry != out and entry not in out.parents:
                hidden[str(entry)] = {}
    for path in {str(Path(p).resolve()) for p in hand_ins} | own:
        shown = hidden.setdefault(str(Path(path).parent), {})
        if path in own:
            shown[path] = False
    work = out / "work"
    mine = {work / "pristine": False, work / _safe(name): True,
            work / f"{_safe(name)}.ipython": True, out / "executed" / _safe(name): True}
    if reference:
        mine[Path(reference).resolve()] = True
    hidden[str(out)] = {str(p): w for p, w in mine.items()}
    read_only = sorted({str(REPO), str(Path(sys.prefix).resolve()),  # (.venv, elsewhere)
                        str(Path(sys.base_prefix).resolve())} |  # the Python it is made from
                       {str(Path(p).parent) for p in hand_ins} |
                       {str(Path(p).parent) for p in own})
    return {"read_only": read_only, "hidden": hidden}


REFERENCE = "the instructor's answers"
CACHE_FILE = re.compile(r"^[\w.-]+\.json$")


def reference_values(lessons: list[Path], pristine: Path, protected: dict, out: Path,
                     args) -> dict[str, str]:
    """The lessons graded once with the instructor's notebooks, before any student's code
    runs: the values of their experiments that no answer changes, as JSON text by file
    name, each checked to decode as data (grade_kernel.from_json). Every student's run gets
    them from this process's memory, so no student's code can change another's."""
    folder = out / "work" / f"reference-{args.world_size}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"# {REFERENCE}: the lessons' experiments, run once for every student", flush=True)
    grades, _ = grade_in_child(REFERENCE, {t.stem: t for t in lessons}, lessons, pristine,
                               protected, out, args, [], reference=folder)
    failed = [f"{g.name} exercise {p.exercise} {p.part}" for g in grades for p in g.parts
              if p.status != "passed"]
    if failed:
        print(f"grade: the instructor's answers failed {len(failed)} part(s) "
              f"({', '.join(failed[:4])}): check the notebooks", file=sys.stderr)
    values = {}
    for path in sorted(folder.iterdir()):
        try:
            if not CACHE_FILE.match(path.name) or not path.is_file() or path.is_symlink():
                raise ValueError("not a file of values")
            text = path.read_text()
            grade_kernel.from_json(json.loads(text))
            values[path.name] = text
        except (OSError, ValueError, TypeError, KeyError) as error:
            print(f"grade: {path.name} from the instructor's run not used: {error}",
                  file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(out / "executed" / _safe(REFERENCE), ignore_errors=True)
    return values


def _read_all(fd: int) -> str:
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace")


def _relay(stream, to) -> None:
    """The grading process's lines, printed here as they come (a test captures them)."""
    for line in stream:
        print(line, end="", file=to, flush=True)


def _one_student(job_path: Path, result_fd: int) -> int:
    job = json.loads(job_path.read_text())
    course.CELL_TIMEOUT_S = job["cell_timeout"]
    args = argparse.Namespace(world_size=job["world_size"], timeout=job["timeout"],
                              lesson_timeout=job["lesson_timeout"])
    cache = Path(job["reference"]) if job["reference"] else None
    if job["cache"]:  # the instructor's values, in a folder of this student's own
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=Path(job["out"]) / "work"))
        for file, text in job["cache"].items():
            (cache / file).write_text(text)
    for path in job["lessons"]:  # before the view hides them
        TEACHERS[path] = Path(path).read_text()
    judged = any(has_judged_exercises(Path(p)) for p in job["lessons"])
    if job.get("view"):
        view = job["view"]
        shown = view["hidden"][job["out"]]
        if cache is not None:
            shown[str(cache)] = True
        for path, writable in shown.items():
            if writable:
                Path(path).mkdir(parents=True, exist_ok=True)
        cluster = any(uses_cluster(read_teacher(Path(p))) for p in job["lessons"])
        home = Path.home()
        private = [Path(tempfile.gettempdir()), Path("/var/tmp"), Path("/dev/shm"),
                   home / ".cache", home / ".config", home / ".local" / "share" / "jupyter"]
        for folder in private[3:]:
            folder.mkdir(parents=True, exist_ok=True)
        # what a private folder still shows: the course, Python, --out, the hand-ins
        needed = {Path(p) for p in view["read_only"]} | {Path(job["out"])}
        stage = Path(job["out"]) / "work" / f"{_safe(job['name'])}.view"
        stage.mkdir(parents=True, exist_ok=True)
        try:  # lessons that build hosts mount their network namespaces
            sandbox.confine([Path(p) for p in view["read_only"]],
                            {Path(k): {Path(p): w for p, w in v.items()}
                             for k, v in view["hidden"].items()}, stage, keep_mounting=cluster,
                            private={} if not WHOLE_VIEW else
                            {f: dict.fromkeys(needed) for f in private},
                            whole_machine=WHOLE_VIEW, no_tracing=WHOLE_VIEW)
        except OSError as error:
            print(f"grade: {job['name']} graded without a view of its own: {error}",
                  file=sys.stderr)
    judge = None
    if judged:
        from tools.judge import Judge
        judge = Judge(job["cache"])  # before any of the student's code runs
    try:
        grades = grade_student(job["name"], {s: Path(p) for s, p in job["notebooks"].items()},
                               [Path(p) for p in job["lessons"]], Path(job["pristine"]),
                               job["protected"], Path(job["out"]), args, job["notes"],
                               cache, write_cache=bool(job["reference"]), judge=judge)
    except Exception as error:  # the grader itself failed on this student
        print(f"grade: could not grade {job['name']}: {type(error).__name__}: {error}",
              file=sys.stderr)
        return 2
    finally:
        if judge:
            judge.close()
        if job["cache"]:
            shutil.rmtree(cache, ignore_errors=True)
    with os.fdopen(result_fd, "w") as result:  # a pipe only the class's run reads
        result.write("\n" + json.dumps(_to_json(grades)) + "\n")
    return 0


# In the view: the whole machine read-only, private temporary folders and no tracing of
# the grader (tools/sandbox.py, `confine`). DDP_GRADE_WHOLE_VIEW=0 keeps only the course,
# Python and the hand-ins read-only, and /tmp shared.
WHOLE_VIEW = os.environ.get("DDP_GRADE_WHOLE_VIEW", "1") != "0"
TEACHERS: dict[str, str] = {}  # the instructor's notebooks, read before a view hid them


def read_teacher(path: Path):
    """An instructor's notebook: as read before the student's view hid it, else from disk."""
    text = TEACHERS.get(str(path))
    return nbformat.reads(text, as_version=4) if text is not None \
        else nbformat.read(path, as_version=4)


def has_judged_exercises(teacher: Path) -> bool:
    """Whether a lesson has exercises the judge checks (tools/judge.py)."""
    return bool(exercise_list(read_teacher(teacher), strict=False))


def kill_marked_by(pid: int) -> None:
    """Kill the processes of every lesson the grading process `pid` ran (their marker
    starts with its pid): what it could not clean up itself, killed."""
    prefix = f"{MARKER}={pid}-".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if any(v.startswith(prefix) for v in (entry / "environ").read_bytes().split(b"\0")):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _self_check(paths: list[Path], args) -> int:
    """Inside a handout: each notebook graded against itself (its visible checks)."""
    from tools import gradebook

    notebooks = []
    for path in paths:
        notebooks += sorted(path.glob("[0-9][0-9]_*.ipynb")) if path.is_dir() else [path]
    notebooks = [p for p in notebooks
                 if exercise_list(nbformat.read(p, as_version=4), strict=False)]
    chosen = [s for s in args.lessons.split(",") if s]
    notebooks = [p for p in notebooks if not chosen or p.stem in chosen]
    if not notebooks:
        print("grade: no lessons with exercises in " + ", ".join(map(str, paths)),
              file=sys.stderr)
        return 2
    print("self-check: your notebooks against their own visible checks (your instructor's "
          "grade adds hidden checks)", flush=True)
    build = Path(tempfile.mkdtemp(prefix="ddp-grade-"))
    try:
        course = make_workspace(build / "course")  # the handout itself, answers and all
        grades = [grade_lesson(p, p, course, course, {}, build / "executed",
                               args.world_size, args.timeout, args.lesson_timeout)
                  for p in notebooks]
    finally:
        shutil.rmtree(build, ignore_errors=True)
    for grade in grades:
        gradebook.print_lesson("you", grade)
    passed = all(p.status == "passed" for g in grades for p in g.parts)
    return 0 if passed else 1  # `make test` fails while a check fails


if __name__ == "__main__":
    sys.exit(main())
