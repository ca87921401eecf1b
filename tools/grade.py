"""`make grade`: execute a learner's notebooks and grade every exercise.

    python -m tools.grade [NOTEBOOK_OR_FOLDER ...] [--world-size N] [--timeout S]
                          [--lesson-timeout S] [--build DIR] [--require-all]

With no notebooks named, it grades the handout's lessons: `build/student/notebooks` in
the course repository, `notebooks/` inside a handout written by `make student`.

It prints one line per exercise (`passed`, `failed: <the first line of the error>`, or
`not run` when the lesson stopped before it), a score per lesson and the total. Each
notebook runs as a transformed copy in a fresh copy of the course (never in place): the
learner's solution cell and the check after it run through a wrapper in the kernel that
records the outcome instead of raising, and stops the exercise after `--timeout` seconds
(a learner's infinite loop fails that exercise; the launches inside a check have their own,
shorter timeouts). A non-exercise cell that fails stops its lesson: the grader names that
cell and its error, and the lesson's remaining exercises count as not run. So does a lesson
that runs past `--lesson-timeout` seconds, and a cell past papermill's backstop (300 s).
Every process a cell started (torchrun and its workers) is killed when its cell is stopped
by a timeout, and whatever a lesson left behind is killed when the lesson ends.

Exit status: 0 once every notebook was graded, whatever the score; 1 with `--require-all`
when an exercise did not pass; 2 when the grader itself could not run (no notebooks, a
notebook it cannot read, a kernel that never started).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tools.course import CELL_TIMEOUT_S, DEFAULT_WORLD_SIZE, REPO, execute, make_workspace
from tools.exercises import exercise_cells

# Above every launch timeout a check uses (120 s at most), below papermill's backstop.
EXERCISE_TIMEOUT_S = CELL_TIMEOUT_S // 2
# A lesson runs in 20 to 40 s when it passes; a stubbed one waits for its launches' timeouts.
LESSON_TIMEOUT_S = 600
MARKER = "DDP_GRADE_RUN"  # in the environment of every process a graded lesson starts


@dataclass
class Outcome:
    number: int
    status: str  # "passed", "failed" or "not run"
    message: str = ""


@dataclass
class LessonGrade:
    name: str
    outcomes: list[Outcome]
    stopped: str = ""  # why the lesson stopped before its end, if it did
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return sum(o.status == "passed" for o in self.outcomes)


def grading_version(nb, results: Path, timeout: float, course_root: Path,
                    lesson_timeout: float = LESSON_TIMEOUT_S):
    """The notebook with each solution and check cell replaced by a call to the kernel's
    grader, and a first cell that sets the grader up. Every cell keeps its index in the
    learner's notebook in `metadata.grade_cell`."""
    nb = copy.deepcopy(nb)
    for index, cell in enumerate(nb.cells):
        cell.metadata["grade_cell"] = index
    for number, (i, j) in enumerate(exercise_cells(nb), start=1):
        for index, stage in ((i, "solution"), (j, "check")):
            if index is None:  # no check left: the exercise cannot pass
                continue
            call = nbformat.v4.new_code_cell(
                f"__grader__.run({number}, {stage!r}, {nb.cells[index].source!r})")
            call.metadata = nb.cells[index].metadata
            nb.cells[index] = call
    setup = nbformat.v4.new_code_cell(
        "import sys as _sys\n"
        f"_sys.path.insert(0, {str(course_root)!r})\n"
        "from tools.grade_kernel import KernelGrader as _KernelGrader  # noqa: E402\n\n"
        f"__grader__ = _KernelGrader({str(results)!r}, {timeout!r}, {lesson_timeout!r})\n"
        "del _sys, _KernelGrader")
    nb.cells.insert(0, setup)
    return nb


def grade_notebook(path: Path, workspace: Path, out_dir: Path, world_size: int,
                   timeout: float, lesson_timeout: float = LESSON_TIMEOUT_S) -> LessonGrade:
    """Execute one learner's notebook and grade it. Raises only when the grader cannot
    run (an unreadable notebook, a kernel that never starts). Whatever the lesson started
    is killed before it returns, even if its kernel died."""
    nb = nbformat.read(path, as_version=4)
    pairs = exercise_cells(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / f"{path.stem}.results.jsonl"
    results.unlink(missing_ok=True)
    results.with_suffix(".running").unlink(missing_ok=True)
    executed = out_dir / path.name
    executed.unlink(missing_ok=True)
    graded = grading_version(nb, results, timeout, workspace, lesson_timeout)
    start = time.monotonic()
    stopped = ""
    # The kernel, and every process it starts, inherits this mark: what is left once the
    # lesson is over (a kernel killed by papermill's backstop leaves its launches running,
    # orphans no longer its children) is found by it and killed.
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    saved = os.environ.get(MARKER)
    os.environ[MARKER] = mark
    try:
        execute(graded, executed, workspace, world_size=world_size)
    except Exception as error:  # the lesson stopped: find the cell, report it
        stopped = _where_it_stopped(executed, results.with_suffix(".running"), graded, error,
                                    nb)
    finally:
        if saved is None:
            del os.environ[MARKER]
        else:
            os.environ[MARKER] = saved
        kill_marked(mark)
    seconds = time.monotonic() - start

    recorded: dict[int, dict] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            entry = json.loads(line)
            recorded.setdefault(entry["exercise"], entry)  # a solution's failure comes first
    outcomes = []
    for number in range(1, len(pairs) + 1):
        entry = recorded.get(number)
        if entry is None and pairs[number - 1][1] is None and not stopped:
            outcomes.append(Outcome(number, "failed", "no check cell after the solution"))
        elif entry is None:
            outcomes.append(Outcome(number, "not run", "the lesson stopped before it"
                                    if stopped else "no result recorded"))
        elif entry["status"] == "passed":
            outcomes.append(Outcome(number, "passed"))
        else:
            where = " (in the solution cell)" if entry["stage"] == "solution" else ""
            outcomes.append(Outcome(number, "failed", entry["message"] + where))
    return LessonGrade(path.stem, outcomes, stopped, seconds)


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


def _where_it_stopped(executed: Path, running: Path, graded, error: Exception,
                      original) -> str:
    name = getattr(error, "ename", None) or type(error).__name__
    value = getattr(error, "evalue", None)
    if value is None:  # not a cell's error: nbclient's timeout, a dead kernel
        value = str(error).strip().splitlines()[0] if str(error).strip() else ""
    last_line = f"{name}: {value}" if value else name
    index = None
    if executed.exists():  # papermill wrote what ran: the failed cell is marked
        for cell in nbformat.read(executed, as_version=4).cells:
            meta = cell.metadata.get("papermill", {})
            if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) \
                    or meta.get("exception") or meta.get("status") == "running":
                index = cell.metadata.get("grade_cell")
                break
    elif running.exists():  # it did not (a timeout, a dead kernel): the kernel's own note
        source = running.read_text()
        index = next((i for i, cell in enumerate(graded.cells)
                      if cell.source == source and "grade_cell" in cell.metadata), None)
        if index is not None:
            index = graded.cells[index].metadata["grade_cell"]
    else:
        raise RuntimeError(f"the notebook did not run at all: {last_line}") from error
    if index is None:
        return f"the notebook stopped outside its own cells: {last_line}"
    first_line = next((line for line in original.cells[index].source.splitlines()
                       if line.strip()), "")
    return f"cell {index + 1} failed ({last_line}); it starts: {first_line.strip()[:80]}"


def default_notebooks() -> Path:
    if (REPO / "tests").is_dir():  # the course repository: grade the handout
        return REPO / "build" / "student" / "notebooks"
    return REPO / "notebooks"  # a handout: grade the learner's own lessons


def find_notebooks(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob("[0-9][0-9]_*.ipynb"))
        elif not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        elif path.suffix == ".ipynb":
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: not a notebook (.ipynb) or a folder of lessons")
    if not found:
        raise FileNotFoundError("no lessons (NN_name.ipynb) in "
                                + ", ".join(str(p) for p in paths)
                                + ": write the handout with `make student`, or name them")
    return found


def report(grade: LessonGrade, out=None) -> None:
    out = out or sys.stdout
    width = len(grade.name)
    stop_shown = not grade.stopped
    for o in grade.outcomes:
        if o.status == "not run" and not stop_shown:  # where the lesson stopped
            print(f"{grade.name}  STOPPED: {grade.stopped}", file=out)
            stop_shown = True
        line = f"{grade.name:<{width}}  exercise {o.number}  {o.status}"
        if o.message:
            line += f" ({o.message})" if o.status == "not run" else f": {o.message}"
        print(line, file=out)
    if not stop_shown:  # it stopped after its last exercise
        print(f"{grade.name}  STOPPED: {grade.stopped}", file=out)
    print(f"{grade.name:<{width}}  score {grade.passed}/{len(grade.outcomes)}"
          f"  ({grade.seconds:.1f} s)", file=out, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks or folders of them (default: the handout's)")
    parser.add_argument("--world-size", type=int, default=DEFAULT_WORLD_SIZE)
    parser.add_argument("--timeout", type=float, default=EXERCISE_TIMEOUT_S,
                        help="seconds an exercise's solution or check may run "
                             f"(default {EXERCISE_TIMEOUT_S})")
    parser.add_argument("--lesson-timeout", type=float, default=LESSON_TIMEOUT_S,
                        help="seconds a whole lesson may run; the cell running then fails "
                             f"and stops the lesson (default {LESSON_TIMEOUT_S})")
    parser.add_argument("--build", type=Path, default=None,
                        help="where to keep the executed notebooks (default: a temporary "
                             "folder, removed at the end)")
    parser.add_argument("--require-all", action="store_true",
                        help="exit 1 unless every exercise passed")
    args = parser.parse_args(argv)

    try:
        paths = find_notebooks(args.notebooks or [default_notebooks()])
    except FileNotFoundError as error:
        print(f"grade: {error}", file=sys.stderr)
        return 2
    build = args.build or Path(tempfile.mkdtemp(prefix="ddp-grade-"))
    try:
        workspace = make_workspace(build / "course")
        grades = []
        for path in paths:
            print(f"# {path}", flush=True)
            try:
                grade = grade_notebook(path, workspace, build / "executed", args.world_size,
                                       args.timeout, args.lesson_timeout)
            except Exception as error:  # the grader could not run this notebook
                print(f"grade: could not grade {path}: {type(error).__name__}: {error}",
                      file=sys.stderr)
                return 2
            report(grade)
            grades.append(grade)
    finally:
        if args.build is None:
            import shutil
            shutil.rmtree(build, ignore_errors=True)
    passed = sum(g.passed for g in grades)
    total = sum(len(g.outcomes) for g in grades)
    print(f"total  {passed}/{total}")
    return 1 if args.require_all and passed < total else 0


if __name__ == "__main__":
    sys.exit(main())
