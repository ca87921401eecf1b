"""`make grade`, the part that runs inside the kernel of the notebook being graded.

Standard library only: the graded notebook's first cell imports it, and that cell runs
under papermill's per-cell timeout (nbformat alone takes seconds to import on a loaded
machine). tools/grade.py is the part that runs outside.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import time
import traceback
from pathlib import Path

MESSAGE_CHARS = 160  # an error's first line is cut to this, to keep one line per exercise


class ExerciseTimeout(BaseException):
    """Raised in the learner's code when an exercise runs past its time. A BaseException,
    so that an `except Exception:` in the learner's code does not swallow it."""


class LessonTimeout(BaseException):
    """Raised in whatever cell runs when the lesson's own time is up: the lesson stops."""


class KernelGrader:
    """Runs inside the kernel. The graded notebook calls `run(number, stage, source)` in
    place of each solution cell and each check cell; the outcome goes to a JSON-lines
    file and nothing raises (but a LessonTimeout), so that the notebook goes on to the next
    exercise. Every cell runs under the lesson's deadline (a SIGALRM timer armed before
    each cell), each exercise stage under the shorter of its own timeout and that deadline;
    a cell stopped by either has the processes it started killed."""

    def __init__(self, results: str, timeout: float, lesson_timeout: float):
        self.results, self.timeout = Path(results), timeout
        self.lesson_timeout = lesson_timeout
        self.deadline = time.monotonic() + lesson_timeout
        self.failed: set[int] = set()
        self._expiring: BaseException | None = None
        # The cell being run, for when the kernel dies or papermill's backstop timeout stops
        # the notebook: papermill then writes no executed copy to read it from.
        self.running = self.results.with_suffix(".running")
        signal.signal(signal.SIGALRM, self._expire)
        events = get_ipython().events  # noqa: F821 (the kernel's own)
        events.register("pre_run_cell", self._starting)
        events.register("post_run_cell", self._finished)

    # the timer
    def _arm(self, exercise_seconds: float | None = None) -> None:
        left = self.deadline - time.monotonic()
        if exercise_seconds is not None and exercise_seconds < left:
            self._expiring = ExerciseTimeout(f"still running after {exercise_seconds:g} s, "
                                             f"stopped")
            delay = exercise_seconds
        else:
            self._expiring = LessonTimeout(f"the lesson ran past its {self.lesson_timeout:g} s"
                                           f" (--lesson-timeout), stopped")
            delay = left
        signal.setitimer(signal.ITIMER_REAL, max(delay, 0.05))

    @staticmethod
    def _disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _expire(self, signum, frame):
        self._disarm()
        raise self._expiring

    def _starting(self, info) -> None:
        self.running.write_text(info.raw_cell)
        self._arm()

    def _finished(self, result) -> None:
        self._disarm()
        if isinstance(result.error_in_exec, (ExerciseTimeout, LessonTimeout)):
            stop_child_processes()  # a launch cut short leaves its processes running

    # the exercises
    def run(self, number: int, stage: str, source: str) -> None:
        if number in self.failed:  # its solution cell failed: the check has nothing to test
            print(f"exercise {number}: not checked, its solution cell failed")
            return
        shell = get_ipython()  # noqa: F821 (the kernel's own)
        filename = f"<exercise {number} {stage}>"
        python, start = source, time.monotonic()
        try:
            python = shell.transform_cell(source)  # %%writefile and other magics into calls
            code = compile(python, filename, "exec")
            self._arm(self.timeout)
            try:
                exec(code, shell.user_ns)
            finally:
                self._disarm()
        except BaseException as error:  # noqa: BLE001 (whatever it is, it is the learner's)
            seconds = time.monotonic() - start
            if isinstance(error, (ExerciseTimeout, LessonTimeout)):
                stop_child_processes()
            message = describe(error, filename, python)
            self.failed.add(number)
            self._record(number, stage, "failed", message, seconds)
            print(f"exercise {number}: {stage} cell failed: {message}")
            if isinstance(error, LessonTimeout):
                raise  # the lesson stops here
            return
        if stage == "check":
            self._record(number, stage, "passed", "", time.monotonic() - start)
            print(f"exercise {number}: passed")

    def _record(self, number, stage, status, message, seconds) -> None:
        entry = {"exercise": number, "stage": stage, "status": status, "message": message,
                 "seconds": round(seconds, 3)}
        with self.results.open("a") as out:
            out.write(json.dumps(entry) + "\n")


def describe(error: BaseException, filename: str, source: str) -> str:
    """The first line of an error, as the grade shows it. A bare `assert` has no message:
    show the statement that failed instead."""
    name = type(error).__name__
    if isinstance(error, SyntaxError) and error.filename == filename:
        text = f"{error.msg} (line {error.lineno})"
    elif isinstance(error, (ExerciseTimeout, LessonTimeout)):
        return f"timed out: {error}"
    else:
        text = str(error).strip().split("\n")[0].strip()
    if isinstance(error, AssertionError) and not text:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
        if frames:
            text = _statement_at(source, frames[-1].lineno)
    line = f"{name}: {text}" if text else name
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 3] + "..."


def _statement_at(source: str, lineno: int) -> str:
    """The statement at a line of `source`, on one line and without its comments."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    found = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)
             and node.lineno <= lineno <= (node.end_lineno or node.lineno)]
    if not found:
        return ""
    innermost = max(found, key=lambda node: node.lineno)  # an assert inside a loop
    return ast.unparse(innermost).split("\n")[0]


def stop_child_processes() -> None:
    """Kill every process this kernel started, and theirs (torchrun runs its launches in a
    session of their own, still children of the kernel)."""
    try:
        table = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True,
                               text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return
    children: dict[int, list[int]] = {}
    for pid, parent in zip(table[0::2], table[1::2]):
        children.setdefault(int(parent), []).append(int(pid))
    todo, found = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in found:  # reap our own children (the others are their parents' to reap)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
