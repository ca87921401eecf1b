"""`make grade`, the part that runs inside the kernel of the notebook being graded.

Standard library only: the graded notebook's first cell imports it, and that cell runs
under papermill's per-cell timeout (nbformat alone takes seconds to import on a loaded
machine). tools/grade.py is the part that runs outside.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import shutil
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
    """Runs inside the kernel. The graded notebook calls, in place of its cells:
    `solution(number, source)` for the learner's answer, `part(number, part, source, ...)`
    for each visible or hidden check (the instructor's), `cell(index, source)` for any
    other cell, `missing(number, message)` for an answer the learner's notebook lacks.
    Each outcome goes to a JSON-lines file and nothing raises (but a LessonTimeout), so
    that the notebook goes on to the next exercise. Every cell runs under the lesson's
    deadline (a SIGALRM timer armed before each cell), each exercise stage under the
    shorter of its own timeout and that deadline; a cell stopped by either has the
    processes it started killed. Before each check, the course's own files that a
    learner's code changed are put back (`protected`: {path: sha256}, copies in `pristine`)."""

    def __init__(self, results: str, timeout: float, lesson_timeout: float,
                 course: str = "", pristine: str = "", protected: dict | None = None,
                 own_files: tuple = (), cache: str = "", backstop: float | None = None,
                 write_cache: bool = False, running: str = ""):
        self.results, self.timeout = Path(results), timeout
        self.lesson_timeout = lesson_timeout
        self.deadline = time.monotonic() + lesson_timeout
        self.failed: dict[int, str] = {}  # exercise: why its solution cell failed
        self.visible_failed: set[int] = set()  # exercises whose visible check failed
        self.absent: set[int] = set()  # exercises whose answer cell is not in the notebook
        self.course, self.pristine = Path(course), Path(pristine)
        self.protected = protected or {}
        self.own_files = tuple(own_files)  # the learner's scripts, for "in your code"
        # the values of the lesson's experiments that no answer changes: written by the
        # instructor's run (write_cache), read by every student's
        # (in the judge, tools/judge.py: a dict {file: JSON text}, held in its memory)
        self.cache_values = cache if isinstance(cache, dict) else None
        self.cache = Path(cache) if cache and isinstance(cache, str) else None
        self.write_cache = write_cache
        self._expiring: BaseException | None = None
        # papermill interrupts a cell past this (a KeyboardInterrupt); one raised sooner
        # came from the learner's code, and fails only what it was raised in
        self.backstop, self._cell_start = backstop, time.monotonic()
        # The cell being run, for when the kernel dies or papermill's backstop timeout stops
        # the notebook: papermill then writes no executed copy to read it from.
        self.running = Path(running) if running else self.results.with_suffix(".running")
        self.oracle = ""  # the folder where the kernel answers the judge (tools/oracle.py)
        self.check_slack = 0.0  # in the judge: more time for a check than the kernel's call
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
        self._cell_start = time.monotonic()
        self.running.write_text(info.raw_cell)
        self._arm()

    def _finished(self, result) -> None:
        self._disarm()
        if isinstance(result.error_in_exec, (ExerciseTimeout, LessonTimeout)):
            stop_child_processes()  # a launch cut short leaves its processes running

    def _exec(self, source: str, filename: str, rewrite: bool = False) -> None:
        """Run `source` in the notebook's namespace under the exercise timeout; a check's
        asserts rewritten as pytest does, so that a failure shows the values compared."""
        shell = get_ipython()  # noqa: F821 (the kernel's own)
        python = shell.transform_cell(source)  # %%writefile and other magics into calls
        code = compile_check(python, filename) if rewrite else compile(python, filename,
                                                                       "exec")
        self._arm(self.timeout + (self.check_slack if rewrite else 0.0))
        try:
            exec(code, shell.user_ns)
        finally:
            self._disarm()
            for name in [n for n in shell.user_ns if n.startswith("@py")]:
                del shell.user_ns[name]

    # the exercises
    def _doing(self, label: str, source: str) -> None:
        """Say what runs, for when the lesson stops here (a timeout, a dead kernel)."""
        first = next((line.strip() for line in source.splitlines() if line.strip()), "")
        self.running.write_text(f"{label}: {first[:70]}")

    def solution(self, number: int, source: str) -> None:
        self._doing(f"exercise {number}, the answer", source)
        start = time.monotonic()
        try:
            self._exec(source, f"<exercise {number} solution>")
        except BaseException as error:  # noqa: BLE001 (whatever it is, it is the learner's)
            self._failed(number, "solution", None, error, f"<exercise {number} solution>",
                         source, start)
            self.failed[number] = describe(error, f"<exercise {number} solution>", source)

    def missing(self, number: int, message: str) -> None:
        self.failed[number] = message
        self.absent.add(number)
        self._record(number, "solution", None, "failed", message, "", 0.0)
        print(f"exercise {number}: {message}")

    def part(self, number: int, part: int, source: str, visible: str = "") -> None:
        """A visible check (`visible` empty) or a hidden one (`visible`: the visible
        check's source, for its `visible_check(**names)`)."""
        if number in self.failed:  # the solution cell failed: nothing to check
            message = self.failed[number] if number in self.absent else (
                f"not checked: the solution cell failed ({self.failed[number]})")
            self._record(number, "check", part, "failed", message, "", 0.0)
            print(f"exercise {number}, part {part}: {message}")
            return
        if part and number in self.visible_failed:  # a hidden check adds to a passing answer
            message = "not run: the visible check failed"
            self._record(number, "check", part, "failed", message, "", 0.0)
            print(f"exercise {number}, part {part}: {message}")
            return
        try:
            restored = self.restore()
        except (OSError, RuntimeError) as error:
            self._record(number, "check", part, "failed", f"not checked: {error}", "", 0.0)
            print(f"exercise {number}, part {part}: not checked: {error}")
            return
        if restored:
            print(f"exercise {number}: put back the course's own " + ", ".join(restored))
        namespace = get_ipython().user_ns  # noqa: F821 (the kernel's own)
        if visible:
            def visible_check(**names):
                check_again(visible, namespace, f"<exercise {number} check>", **names)
            namespace["visible_check"] = visible_check
        filename = f"<exercise {number} check {part}>"
        self._doing(f"exercise {number}, " + (f"hidden check {part}" if part else "check"),
                    source)
        start = time.monotonic()
        try:
            self._exec(source, filename, rewrite=True)
        except BaseException as error:  # noqa: BLE001
            if not part:
                self.visible_failed.add(number)
            self._failed(number, "check", part, error, filename, source, start)
            return
        self._record(number, "check", part, "passed", "", "", time.monotonic() - start)
        print(f"exercise {number}, part {part}: passed")

    def cell(self, label: str, source: str, key: str = "", names: tuple = ()) -> None:
        """A cell that is no exercise ("lesson cell 12", or "your cell 21", one the learner
        added): its failure is noted, and the lesson goes on. A lesson's experiment that no
        answer changes (`key`) runs in the instructor's run, which keeps the values it
        assigns (`names`) as JSON when they are plain data; a student's run takes them from
        there instead of running it (decoded by `from_json`: data, never code)."""
        namespace = get_ipython().user_ns  # noqa: F821 (the kernel's own)
        kept = self.cache / f"{key}.json" if key and self.cache else None
        text = None
        if key and self.cache_values is not None:
            text = self.cache_values.get(f"{key}.json")
        elif kept is not None and not self.write_cache and kept.is_file():
            try:
                text = kept.read_text()
            except OSError as error:
                print(f"{label}: the instructor's values are unreadable ({error}): run here")
        if text is not None:
            try:
                values = from_json(json.loads(text))
                if not isinstance(values, dict) or not set(values) <= set(names):
                    raise ValueError(f"names {sorted(values)} for {sorted(names)}")
            except (ValueError, TypeError, KeyError) as error:
                print(f"{label}: the instructor's values are unreadable ({error}): run here")
            else:
                namespace.update(values)
                message = "the values it assigns, from the instructor's run"
                with self.results.open("a") as out:
                    out.write(json.dumps({"cell": label, "status": "kept", "message": message,
                                          "seconds": 0.0}) + "\n")
                print(f"{label}: {message}")
                return
        self._doing(label, source)
        start = time.monotonic()
        try:
            self._exec(source, f"<{label}>")
            if kept is not None and self.write_cache:
                values = {name: namespace[name] for name in names if name in namespace}
                if all(plain(v) for v in values.values()):
                    temporary = kept.with_suffix(f".{os.getpid()}.tmp")
                    temporary.write_text(json.dumps(to_json(values)))
                    os.replace(temporary, kept)
        except BaseException as error:  # noqa: BLE001
            if isinstance(error, (ExerciseTimeout, LessonTimeout)):
                stop_child_processes()
            if self._stops_the_lesson(error):
                raise  # the lesson stops here (its time, or papermill's backstop), and says so
            message = describe(error, f"<{label}>", source)
            entry = {"cell": label, "status": "failed", "message": message,
                     "seconds": round(time.monotonic() - start, 3)}
            with self.results.open("a") as out:
                out.write(json.dumps(entry) + "\n")
            print(f"{label} failed: {message}")

    def _stops_the_lesson(self, error: BaseException) -> bool:
        """The lesson's time is up, or papermill's backstop interrupted the cell."""
        if isinstance(error, LessonTimeout):
            return True
        return isinstance(error, KeyboardInterrupt) and (
            self.backstop is None or time.monotonic() - self._cell_start >= 0.9 * self.backstop)

    def _failed(self, number, stage, part, error, filename, source, start) -> None:
        seconds = time.monotonic() - start
        if isinstance(error, (ExerciseTimeout, LessonTimeout)):
            stop_child_processes()
        message = describe(error, filename, source)
        if isinstance(error, KeyboardInterrupt) and not self._stops_the_lesson(error):
            message += (" (raised by the code, not a timeout: did an answer rebind a name "
                        "the check uses, such as AssertionError?)")
        where = blame(error, number, self.own_files, source if stage == "check" else "")
        if where:
            message = f"{message} [raised in your code: {where}]"
        self._record(number, stage, part, "failed", message, details(error), seconds)
        print(f"exercise {number}: {stage} failed: {message}")
        if self._stops_the_lesson(error):
            raise error

    def serve(self, number: int) -> None:
        """Where a function exercise's check was: answer the judge's calls on the student's
        functions (tools/oracle.py), each under the exercise's timeout, until the judge
        lets the lesson go on."""
        from tools.oracle import serve

        self._disarm()  # the judge has its own time; papermill's backstop still stands
        self._doing(f"exercise {number}, answering the judge's calls", "")
        answered = serve(self.oracle, number, get_ipython().user_ns,  # noqa: F821
                         0.9 * (self.backstop or 300), self._call_timer)
        print(f"exercise {number}: answered {answered} of the judge's calls")

    @contextlib.contextmanager
    def _call_timer(self):
        self._expiring = ExerciseTimeout(f"still running after {self.timeout:g} s, stopped")
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            yield
        except ExerciseTimeout:
            stop_child_processes()  # what the call started
            raise
        finally:
            self._disarm()

    def restore(self) -> list[str]:
        """Put back every protected file of the course that differs from the instructor's."""
        restored = []
        for relative, digest in self.protected.items():
            target = self.course / relative
            try:
                same = hashlib.sha256(target.read_bytes()).hexdigest() == digest
            except OSError:
                same = False
            if not same:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.pristine / relative, target)
                if hashlib.sha256(target.read_bytes()).hexdigest() != digest:
                    raise RuntimeError(f"{relative} was changed, and so was the clean copy it "
                                       f"is put back from")
                restored.append(relative)
        return restored

    def _record(self, number, stage, part, status, message, detail, seconds) -> None:
        entry = {"exercise": number, "stage": stage, "part": part, "status": status,
                 "message": message, "detail": detail, "seconds": round(seconds, 3)}
        with self.results.open("a") as out:
            out.write(json.dumps(entry) + "\n")


def plain(value, depth: int = 0) -> bool:
    """Whether a value is data that `to_json` keeps whole: numbers, strings, containers of
    them, and the course's own records (a LaunchResult, a dataclass of tools/); not a path
    (the file behind it may be gone for the next student), a figure, a module or a
    function."""
    if depth > 20:
        return False
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    if _record_class(type(value)):
        return all(plain(v, depth + 1) for v in vars(value).values())
    return False


def _record_class(cls) -> bool:
    """A dataclass of the course's own tools/ (LaunchResult): data, rebuilt field by field."""
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and cls.__module__.startswith("tools.") and "<" not in cls.__qualname__)


def to_json(value):
    """`value` (plain data, see `plain`) as JSON, its types kept: a one-key object tags
    what JSON lacks (a tuple, a set, bytes, a complex number, a dict whose keys are not all
    strings, a course record). Raises TypeError on anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [to_json(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [to_json(v) for v in value]}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, complex):
        return {"__complex__": [value.real, value.imag]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"__dict__": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if _record_class(type(value)):
        cls = type(value)
        return {"__record__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {k: to_json(v) for k, v in vars(value).items()}}
    raise TypeError(f"not plain data: {type(value).__name__}")


def from_json(data):
    """What `to_json` made, back: data only. A record is rebuilt only as a dataclass of
    the course's tools/ and only with that class's own fields; anything else raises
    ValueError (a pickle would run whatever code its bytes name)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [from_json(v) for v in data]
    if not isinstance(data, dict):
        raise ValueError(f"not JSON data: {type(data).__name__}")
    if len(data) == 1:
        (tag, inner), = data.items()
        if tag == "__tuple__":
            return tuple(from_json(v) for v in inner)
        if tag == "__set__":
            return {from_json(v) for v in inner}
        if tag == "__bytes__":
            return base64.b64decode(inner, validate=True)
        if tag == "__complex__":
            return complex(*inner)
        if tag == "__dict__":
            return {from_json(k): from_json(v) for k, v in inner}
    if set(data) == {"__record__", "fields"}:
        module, _, name = str(data["__record__"]).partition(":")
        if not module.startswith("tools.") or not name.isidentifier():
            raise ValueError(f"not a record of the course: {data['__record__']!r}")
        cls = getattr(importlib.import_module(module), name, None)
        if not _record_class(cls):
            raise ValueError(f"not a record of the course: {data['__record__']!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data["fields"], dict) or not set(data["fields"]) <= fields:
            raise ValueError(f"fields of {name}: {sorted(data['fields'])}")
        record = object.__new__(cls)
        record.__dict__.update({k: from_json(v) for k, v in data["fields"].items()})
        return record
    if any(k.startswith("__") for k in data):
        raise ValueError(f"unknown tag in {sorted(data)[:3]}")
    return {k: from_json(v) for k, v in data.items()}


def compile_check(source: str, filename: str):
    """Compile a check with its asserts rewritten by pytest (installed with the course), so
    that a failed `assert f(x) == y` says what f(x) was; plain compile if that fails."""
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        tree = ast.parse(source, filename)
        rewrite_asserts(tree, source.encode(), None, None)
        return compile(tree, filename, "exec")
    except SyntaxError:
        raise
    except Exception:  # noqa: BLE001 (pytest missing or changed: plain asserts still work)
        return compile(source, filename, "exec")


def details(error: BaseException, lines: int = 12) -> str:
    """An error's message beyond its first line (pytest's explanation of an assert, a
    launch's output tail), for the feedback page."""
    text = str(error).strip()
    if isinstance(error, AssertionError):
        text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)
    kept = text.splitlines()[1:]
    return "\n".join(kept[-lines:]) if len(kept) > lines else "\n".join(kept)


def blame(error: BaseException, number: int, own_files: tuple, check_source: str = "") -> str:
    """Where the learner's own code raised: a line of their solution cell in the traceback,
    or, for a launched script, the last line of theirs that a rank's traceback names."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [(f.lineno, f.name) for f in frames if f.filename == f"<exercise {number} solution>"]
    remote = getattr(error, "oracle_where", None)  # raised in the kernel (tools/oracle.py)
    if not mine and remote and remote[0] == f"<exercise {number} solution>":
        mine = [tuple(remote[1:])]
    if mine:  # a timeout there too: the learner's loop
        where = f"solution cell, line {mine[-1][0]}, in {mine[-1][1]}"
        calls = [f for f in frames if f.filename.startswith(f"<exercise {number} check")]
        if calls and check_source:  # the check's line that called it
            statement = _statement_at(check_source, calls[-1].lineno)
            if statement:
                where += f", called by the check's `{statement[:90]}`"
        return where
    text = str(error)
    for name in own_files:
        found = re.findall(rf'File "[^"]*{re.escape(name)}", line (\d+), in (\w+)', text)
        if found:
            line, function = found[-1]
            return f"{name}, line {line}, in {function}"
    return ""


def check_again(source: str, namespace: dict, filename: str, **names) -> None:
    """Run a visible check's `source` again in `namespace` with `names` set (for example
    `world_size=3`), then put the namespace's own values back: a hidden check's
    `visible_check(world_size=3)`."""
    missing = object()
    saved = {name: namespace.get(name, missing) for name in names}
    namespace.update(names)
    try:
        exec(compile(source, filename, "exec"), namespace)
    finally:
        for name, value in saved.items():
            if value is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = value


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
        text = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", text)
        raised = rank_error(error)
        if raised:  # a launch failed: say why, not only which command (it is in the details)
            text = f"{re.sub(r'`[^`]*`', 'the launch', text)} A rank raised {raised}"
    if isinstance(error, AssertionError) and not text:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == filename]
        if frames:
            text = _statement_at(source, frames[-1].lineno)
    line = f"{name}: {text}" if text else name
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 3] + "..."


RAISED = re.compile(r"^(?:\[\w+\]:)?\s*((?:[\w.]+\.)?\w*(?:Error|Exception)\b(?::.*)?)$", re.M)


def rank_error(error: BaseException) -> str:
    """The last exception a rank printed, when `error` is a failed launch (it carries
    the run: tools.launch.LaunchError), else ""."""
    result = getattr(error, "result", None)
    if result is None:
        return ""
    texts = [*getattr(result, "stderr_by_rank", {}).values(), getattr(result, "output", "")]
    for text in texts:
        found = [m.group(1).strip() for m in RAISED.finditer(text or "")
                 if "ChildFailedError" not in m.group(1)]
        if found:
            return found[-1]
    return ""


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
