"""Run a companion script under torchrun from a notebook or a test.

A plain ``!torchrun ...`` in a notebook cell ignores the exit status and can hang
forever. ``launch`` instead:

* prints the exact command a learner would type at a shell;
* streams every rank's output as it arrives (torchrun's ``--tee 3`` prefixes each
  line with ``[default<local_rank>]:``);
* bounds the run with a timeout, and on expiry kills torchrun, its workers and
  everything they started;
* raises ``LaunchError`` (with the tail of the output) when the script fails, or
  ``LaunchTimeout`` when it runs out of time;
* never uses a fixed port (``--standalone`` lets the OS pick a free one);
* with ``out=True`` passes ``--out PATH`` to the script and returns the JSON that
  rank 0 wrote there;
* with ``expect_failure=True`` returns the captured output of a run that is meant
  to fail, so that a check cell can assert on the error message.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Variables a launcher sets for its workers. They are removed from what a launch
# inherits, so that a script started "without torchrun" really has none of them.
LAUNCHER_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
)

TAIL_LINES = 40
RANK_LINES = 20
KILL_GRACE_S = 3.0
_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+)(?P<local_rank>\d+)\]:(?P<text>.*)$")


class LaunchError(RuntimeError):
    """The launched script failed (or succeeded when it was expected to fail)."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


class LaunchTimeout(LaunchError):
    """The launched script ran past its timeout and was killed."""


@dataclass
class LaunchResult:
    command: str  # the command a learner would type, from the repository root
    returncode: int | None  # None when the run was killed at its timeout
    output: str  # everything torchrun and the ranks printed (stdout and stderr)
    seconds: float
    timed_out: bool = False
    data: dict | list | None = None  # the JSON rank 0 wrote to --out, if asked for

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def rank_lines(self, local_rank: int) -> list[str]:
        """The lines one local rank printed, with torchrun's prefix removed."""
        found = []
        for line in self.output.splitlines():
            m = _PREFIX.match(line)
            if m and int(m["local_rank"]) == local_rank:
                found.append(m["text"])
        return found

    def tail(self, n: int = TAIL_LINES) -> str:
        return "\n".join(self.output.splitlines()[-n:])

    def summary(self, n: int = RANK_LINES) -> str:
        """What a person needs to see of a failed run: the last lines the ranks printed
        (the script's own error) and torchrun's failure report, without torchrun's
        own Python traceback in between. Falls back to the plain tail."""
        lines = self.output.splitlines()
        parts = []
        from_ranks = [line for line in lines if _PREFIX.match(line)][-n:]
        if from_ranks:
            parts.append("Last lines from the ranks:\n" + "\n".join(from_ranks))
        starts = [i for i, line in enumerate(lines) if line.endswith(" FAILED")]
        if starts:
            parts.append("torchrun's report:\n" + "\n".join(lines[starts[-1]:]))
        return "\n\n".join(parts) if parts else self.tail()


def torchrun_argv(script: str, args=(), nproc: int = 2) -> list[str]:
    """The torchrun command line (as a learner types it) for a one-machine run."""
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "--tee", "3",
            str(script), *map(str, args)]


def launch(script: str, *args, nproc: int | None = 2, timeout: float = 120,
           out: bool | str | Path = False, expect_failure: bool = False,
           echo: bool = True, env: dict | None = None,
           cwd: str | Path = REPO) -> LaunchResult:
    """Run ``script`` (a path relative to the repository root) and check how it ended.

    ``nproc=None`` runs it with plain ``python`` instead of torchrun (to show what a
    script does when it is not launched by torchrun).
    """
    script_path = Path(cwd) / script
    if not script_path.is_file():
        raise FileNotFoundError(f"no script at {script_path}")
    args = [str(a) for a in args]
    out_path, out_folder = None, None
    if out is True:  # a fresh folder of our own, removed once the JSON is read
        out_folder = Path(tempfile.mkdtemp(prefix="ddp-course-"))
        out_path = out_folder / (Path(script).stem + ".json")
    elif out:
        out_path = Path(out)
        out_path.unlink(missing_ok=True)
    if out_path is not None:
        args += ["--out", str(out_path)]

    if nproc is None:
        shown = ["python", str(script), *args]
        argv = [sys.executable, *shown[1:]]
    else:
        shown = torchrun_argv(script, args, nproc)
        argv = [sys.executable, "-m", "torch.distributed.run", *shown[1:]]
    command = shlex.join(shown)

    child_env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env.update(env or {})

    if echo:
        print(f"$ {command}", flush=True)
    try:
        returncode, output, seconds, timed_out = _run(argv, child_env, cwd, timeout, echo)
        result = LaunchResult(command, returncode, output, seconds, timed_out)
        if result.ok and out_path is not None and out_path.is_file():
            result.data = json.loads(out_path.read_text())
    finally:
        if out_folder is not None:
            shutil.rmtree(out_folder, ignore_errors=True)

    if timed_out:
        if expect_failure:
            return result
        raise LaunchTimeout(
            f"`{command}` did not finish within {timeout:g} s and was killed "
            f"(its whole process tree).\n{result.summary()}", result)
    if expect_failure:
        if result.ok:
            raise LaunchError(f"`{command}` was expected to fail but exited 0.", result)
        return result
    if not result.ok:
        raise LaunchError(
            f"`{command}` failed with exit status {returncode} after {seconds:.1f} s.\n"
            f"{result.summary()}", result)
    if out_path is not None and result.data is None:
        raise LaunchError(f"`{command}` exited 0 but wrote no results to {out_path}.", result)
    if echo:
        print(f"[launch] finished in {seconds:.1f} s", flush=True)
    return result


def _run(argv, env, cwd, timeout, echo):
    start = time.monotonic()
    deadline = start + timeout
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
        start_new_session=True,  # its own process group, killed as one on timeout
    )
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    # A reader thread fills the queue; this thread prints, so that a notebook shows
    # the lines in the cell that launched the run.
    threading.Thread(target=pump, daemon=True).start()
    captured: list[str] = []
    timed_out = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            continue
        if line is None:
            break
        captured.append(line)
        if echo:
            print(line, end="", flush=True)
    if not timed_out:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        kill_tree(proc)
        # Whatever was printed before the kill is part of the story.
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                break
            if line is None:
                break
            captured.append(line)
        if echo:
            print(f"[launch] timed out after {timeout:g} s: killed the run", flush=True)
    proc.stdout.close()
    returncode = None if timed_out else proc.returncode
    return returncode, "".join(captured), time.monotonic() - start, timed_out


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (torchrun starts each worker in a new session,
    so killing torchrun's process group alone would leave the workers running)."""
    children: dict[int, list[int]] = {}
    try:
        table = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="],
                               capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    fields = table.split()
    for child, parent in zip(fields[0::2], fields[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """Stop a launch: SIGTERM to torchrun's group (it then stops its workers), then
    SIGKILL to every process that is still there, the workers' own groups included."""
    tree = descendants(proc.pid)
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *tree]:
        _signal_group(pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # a group leader: signal its whole group
            os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
