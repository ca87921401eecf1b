"""`make grade`'s judge: the exercises' checks, run where no student's code ran.

A script exercise's checks launch the student's script and judge what it wrote; a function
exercise's call the student's functions and judge what they return. In the student's
kernel, an answer could rebind what a check calls (`launch`, `abs`, `sorted`,
`AssertionError`, the grader's record) and pass it; here the checks run in a process of
the grader's own:

- `Judge()` forks a server from the grading process as it starts, before any student's
  code has run anywhere, with the course's tools, IPython and torch imported from the
  instructor's files (what a student's code changes later is not read again);
- for each lesson, `run(job)` has the server fork a worker, which runs the judge's cells
  (tools/grade.py, `plan_lesson`: the lesson's own cells that the checks need, then the
  visible and hidden checks; no cell of the student's) in an IPython shell of its own, in
  the student's course, taking turns with the student's kernel: at each exercise the
  kernel waits while the judge checks it, and answers the judge's calls on the student's
  functions (tools/oracle.py);
- what the checks find comes back over a pipe, as the kernel's results do in a file.

A student's code that kills the judge fails those checks ("the judge stopped"); the
student's scripts run as they would in the kernel, in the student's sandbox.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

DONE = "judge-done"


def _preload() -> None:
    """What the judge's cells import, loaded now from the instructor's files."""
    import IPython.core.interactiveshell  # noqa: F401
    import torch  # noqa: F401

    import tools.capture  # noqa: F401
    import tools.grade_kernel  # noqa: F401
    import tools.launch  # noqa: F401
    import tools.oracle  # noqa: F401
    import tools.plots  # noqa: F401


class Judge:
    def __init__(self, cache: dict | None = None):
        """`cache`: the values of the lessons' experiments ({file: JSON text}), from the
        instructor's run; held in the judge's memory, where a student's code cannot write."""
        _preload()
        self.cache = dict(cache or {})
        jobs_r, self._jobs = os.pipe()
        self._answers, answers_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the server
            os.close(self._jobs)
            os.close(self._answers)
            code = 0
            try:
                _serve(jobs_r, answers_w, self.cache)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(jobs_r)
        os.close(answers_w)
        self._buffer, self._number = b"", 0

    def run(self, job: dict, limit: float) -> tuple[list[dict], str]:
        """Run one lesson's judged cells; (the results, why it stopped or "")."""
        self._number += 1
        self._drain()  # what a worker stopped earlier left
        try:
            os.write(self._jobs, (json.dumps({**job, "number": self._number}) + "\n").encode())
        except OSError as error:
            return [], f"the judge is gone ({error.strerror}): the student's code may have " \
                       "stopped it"
        entries, worker, deadline = [], None, time.monotonic() + limit
        while True:
            line = self._line(deadline)
            if line is None:
                if worker:
                    _kill(worker, group=True)
                why = "ran past its time" if time.monotonic() >= deadline else "stopped"
                return entries, f"the judge {why}: the student's code may have stopped it"
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if DONE in message:
                if message.get("number") != self._number:
                    continue  # the end of a job stopped earlier
                if message[DONE] == "started":
                    worker = message["pid"]
                else:
                    return entries, message.get("why", "")
            else:
                entries.append(message)

    def _drain(self) -> None:
        self._buffer = b""
        while select.select([self._answers], [], [], 0)[0]:
            if not os.read(self._answers, 65536):
                return

    def _line(self, deadline: float) -> str | None:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                return None
            chunk = os.read(self._answers, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace")

    def close(self) -> None:
        for fd in (self._jobs, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        _kill(self.pid)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _kill(pid: int, group: bool = False) -> None:
    """SIGKILL to `pid`, and to its process group (a worker's launches) if `group`."""
    for kill in (os.kill, os.killpg) if group else (os.kill,):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _serve(jobs_r: int, answers_w: int, cache: dict) -> None:
    """The server: one job a line; a worker forked for each, waited for, its end said."""
    with os.fdopen(jobs_r) as jobs:
        for line in jobs:
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                jobs.close()  # a worker left behind keeps no server's pipe open
                os._exit(_work(job, answers_w, cache))
            _say(answers_w, {DONE: "started", "pid": pid, "number": job["number"]})
            _, status = os.waitpid(pid, 0)
            why = ""
            if os.WIFSIGNALED(status):
                why = f"the judge was killed by signal {os.WTERMSIG(status)}"
            elif os.WEXITSTATUS(status):
                why = f"the judge exited with status {os.WEXITSTATUS(status)}"
            _say(answers_w, {DONE: "finished", "why": why, "number": job["number"]})


def _say(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _work(job: dict, answers_w: int, cache: dict) -> int:
    """A worker: the judged cells in an IPython shell of its own, in the student's course."""
    from IPython.core.interactiveshell import InteractiveShell

    os.setpgid(0, 0)  # its launches, killed with it
    from tools import zygote
    # The warm server that tools.launch started as it was imported belongs to the grading
    # process (not a parent of this one, so it looks gone from here): the launches here
    # take the one the job names (SHARED, the kernels' own), or start their own.
    zygote._server = None
    os.environ.update(job.get("env", {}))
    os.environ[job["marker_name"]] = job["marker"]
    os.chdir(job["cwd"])
    devnull = os.open(os.devnull, os.O_WRONLY)  # what the checks print is not kept
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    shell = InteractiveShell.instance()
    shell.user_ns["__judge_results__"] = f"/dev/fd/{answers_w}"
    shell.user_ns["__judge_cache__"] = cache
    for source in job["cells"]:
        result = shell.run_cell(source, store_history=False)
        error = result.error_in_exec or result.error_before_exec
        if error is not None and type(error).__name__ == "LessonTimeout":
            break
    return 0
