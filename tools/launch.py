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
  to fail, so that a check cell can assert on the error message (and on the JSON
  the run wrote before it failed, if it wrote one).

``launch_ranks`` does the same for plain Python processes started by hand (as a
scheduler would start them), and ``launch_nodes`` for several torchrun agents that
play the nodes of a cluster on this one machine.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools import assertions

REPO = Path(__file__).resolve().parent.parent
assertions.register()  # in a lesson's kernel: a failed check shows what it compared


def course_root() -> Path:
    """The course whose scripts a launch runs (paths are relative to it): the one whose
    notebooks/ folder this process works in, as a lesson's kernel does, so that a copy of
    the course (`make course`, the tests and the grader run lessons in copies) launches the
    scripts its lessons just wrote; else the course this process works in; else this
    checkout."""
    here = Path.cwd()
    for root in (here.parent, here) if here.name == "notebooks" else (here,):
        if (root / "ddp_scripts").is_dir() and (root / "notebooks").is_dir():
            return root
    return REPO

# Variables a launcher sets for its workers. They are removed from what a launch
# inherits, so that a script started "without torchrun" really has none of them.
LAUNCHER_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
    "DDP_COURSE_ZYGOTE",  # the warm server this process uses (tools/zygote.py), not theirs
    "DDP_COURSE_LAUNCH_LOG",  # where this process records its launches
    "DDP_COURSE_COLD_LAUNCH",  # how this process launches
)

TAIL_LINES = 40
RANK_LINES = 20
STDERR_LINES = 8  # of a rank's stderr, when its last line is not among the lines shown
KILL_GRACE_S = 3.0
DRAIN_S = 2.0  # at most this long to read a stopped run's last lines
STACKS_LIMIT_S = 15.0  # at most this long to take the stacks of a timed-out run
_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+)(?P<local_rank>\d+)\]:(?P<text>.*)$")
_LABELLED = re.compile(r"^\[[A-Za-z_]+\d+\]")


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
    # torchrun launches: each local rank's stderr in the last attempt, from torchrun's log
    # files. torchrun copies a worker's stdout and stderr to its console in two threads
    # that each poll their file, so a rank's last error can come out *before* the stdout
    # lines it printed earlier; the files keep the streams apart.
    stderr_by_rank: dict[int, str] = field(default_factory=dict)
    # Whether every process was forked warm (tools/zygote.py) rather than started anew.
    warm: bool = False
    # Each process's exit status, in the order of the commands (None: killed at the end)
    exit_codes: list = field(default_factory=list)

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
        """What a person needs to see of a failed run: the last lines each rank printed
        (the script's own error: a rank that is still chatting cannot push out the error
        of one that stopped), about `n` in all, and torchrun's failure report, without
        torchrun's own Python traceback in between. Falls back to the plain tail."""
        lines = self.output.splitlines()
        parts = []
        by_rank: dict[str, list[str]] = {}
        for line in lines:
            label = _LABELLED.match(line)
            if label:
                by_rank.setdefault(label.group(0), []).append(line)
        if by_rank:
            each = max(5, n // len(by_rank))
            shown = [line for rank in by_rank.values() for line in rank[-each:]]
            parts.append("Last lines from the ranks:\n" + "\n".join(shown))
            for local_rank, text in sorted(self.stderr_by_rank.items()):
                last = text.rstrip("\n").splitlines()[-STDERR_LINES:]
                if last and not any(line.endswith(last[-1]) for line in shown):
                    parts.append(f"Local rank {local_rank}'s last lines on stderr:\n"
                                 + "\n".join(last))
        starts = [i for i, line in enumerate(lines) if line.endswith(" FAILED")]
        if starts:
            parts.append("torchrun's report:\n" + "\n".join(lines[starts[-1]:]))
        stacks = min((i for i in (self.output.find("[launch] stack of process "),
                                    self.output.find("[launch] install py-spy")) if i >= 0),
                     default=-1)
        if stacks >= 0:  # a timed-out run: where each process was
            parts.append(self.output[stacks:].rstrip("\n"))
        return "\n\n".join(parts) if parts else self.tail()


def torchrun_argv(script: str, args=(), nproc: int = 2, max_restarts: int = 0) -> list[str]:
    """The torchrun command line (as a learner types it) for a one-machine run."""
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", *restarts, "--tee", "3",
            str(script), *map(str, args)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago: ask the system for one, then release it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# The device files a CUDA or ROCm runtime opens to reach a GPU on Linux: the NVIDIA
# driver's /dev/nvidia0, /dev/nvidia1, ... (also inside containers that are given GPUs),
# /dev/dxg under WSL 2, and ROCm's /dev/kfd.
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


def no_gpu_possible() -> bool:
    """True where no GPU can be visible to PyTorch: Linux without any of the device files
    above, or macOS (no CUDA). Answered without importing torch, which costs a notebook's
    kernel about 2 s on 2 cores; anywhere else, torch has to count."""
    if sys.platform == "darwin":
        return True
    return sys.platform == "linux" and not any(glob.glob(p) for p in GPU_DEVICE_FILES)


def cpu_unless_enough_gpus(nproc_per_node: int) -> dict:
    """Environment for a launch of ``nproc_per_node`` processes per node: nothing on a
    machine without GPUs or with enough of them (one each); on a machine with too few,
    hide the GPUs so that every rank uses the CPU and Gloo instead of crowding one GPU."""
    if no_gpu_possible():
        return {}
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0 or gpus >= nproc_per_node:
        return {}
    print(f"[launch] {gpus} GPU(s) for {nproc_per_node} processes: running on the CPU",
          flush=True)
    return {"CUDA_VISIBLE_DEVICES": ""}


@dataclass
class _Process:
    label: str | None  # prefix for its lines; None when torchrun prefixes them itself
    shown: list[str]  # the command as a learner types it
    argv: list[str]  # the command as it runs
    env: dict
    log_dir: Path | None = None  # torchrun's --log-dir, read once the run has ended
    host: str = ""  # the host whose shell it is typed into (lesson 32), shown as "host$"
    # On a host: the command as it runs there (`argv` wraps it to enter the host's
    # namespaces), and those namespaces, for a warm start (tools/cluster.py's `namespaces`).
    inside: list[str] | None = None
    namespaces: dict | None = None
    # Its failure is its own (a host that dies, in lesson 26): the others go on.
    on_its_own: bool = False
    # Started once this says True (a host that comes back, in lesson 26), not at once.
    start_when: Callable[[], bool] | None = None


def launch(script: str, *args, nproc: int | None = 2, timeout: float = 120,
           out: bool | str | Path = False, expect_failure: bool = False,
           echo: bool = True, env: dict | None = None,
           cwd: str | Path | None = None, max_restarts: int = 0) -> LaunchResult:
    """Run ``script`` (a path relative to the repository root) under torchrun on this
    machine and check how it ended.

    ``nproc=None`` runs it with plain ``python`` instead of torchrun (to show what a
    script does when it is not launched by torchrun). ``max_restarts`` is passed to
    torchrun as ``--max-restarts``: how often it restarts the workers after a failure.
    """
    def build(args):
        if nproc is None:
            shown = ["python", str(script), *args]
            return [_Process(None, shown, [sys.executable, *shown[1:]], {})]
        shown = torchrun_argv(script, args, nproc, max_restarts)
        # Not shown, as a learner does not need it: torchrun keeps each rank's stdout and
        # stderr in files under --log-dir, from which a failure's summary takes the stderr.
        log_dir = Path(tempfile.mkdtemp(prefix="ddp-course-logs-"))
        argv = [sys.executable, "-m", "torch.distributed.run", "--log-dir", str(log_dir),
                *shown[1:]]
        return [_Process(None, shown, argv, {}, log_dir)]

    return _launch(build, script, args, timeout, out, expect_failure, echo, env, cwd)


def launch_ranks(script: str, *args, nproc: int = 2, world_size: int | None = None,
                 only_ranks: list[int] | None = None, timeout: float = 120,
                 out: bool | str | Path = False, expect_failure: bool = False,
                 echo: bool = True, env: dict | None = None, cwd: str | Path | None = None,
                 names: tuple[str, str, str] = ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
                 ) -> LaunchResult:
    """Start ``nproc`` plain Python processes, the way a scheduler or a hand-written
    launcher would: each gets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (``world_size``,
    default ``nproc``; larger makes a world that never fills) and nothing else, so the
    script must find the others by its own init method. ``names`` renames the three, as
    a scheduler names them (Slurm's srun: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS).
    ``only_ranks`` starts just those ranks. Lines are prefixed ``[rankN]:``. As torchrun
    does, once one process fails the others are stopped."""
    world_size = nproc if world_size is None else world_size
    ranks = range(nproc) if only_ranks is None else only_ranks

    def build(args):
        processes = []
        for rank in ranks:
            variables = dict(zip(names, (str(rank), str(rank), str(world_size))))
            shown = [*(f"{k}={v}" for k, v in variables.items()), "python", str(script),
                     *args]
            processes.append(_Process(f"rank{rank}", shown,
                                      [sys.executable, str(script), *args], variables))
        return processes

    return _launch(build, script, args, timeout, out, expect_failure, echo, env, cwd)


def launch_nodes(script: str, *args, nnodes: int = 2, nproc: int = 2,
                 timeout: float = 120, out: bool | str | Path = False,
                 expect_failure: bool = False, echo: bool = True, env: dict | None = None,
                 cwd: str | Path | None = None) -> LaunchResult:
    """Pretend this machine is ``nnodes`` nodes: one torchrun agent per node, meeting
    through c10d rendezvous on a free local port, exactly as on a cluster (where each
    command runs on its own machine and the endpoint is node 0's address). Lines are
    prefixed ``[nodeK]``."""
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"ddp-course-{os.getpid()}-{time.monotonic_ns()}"

    def build(args):
        shown = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
                 "--tee", "3", str(script), *args]
        argv = [sys.executable, "-m", "torch.distributed.run", *shown[1:]]
        return [_Process(f"node{k}", shown, argv, {}) for k in range(nnodes)]

    return _launch(build, script, args, timeout, out, expect_failure, echo, env, cwd)


def launch_environment() -> dict:
    """What a launch inherits: this process's environment, without a launcher's variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    return env


TIMEOUT_SCALE = "DDP_COURSE_TIMEOUT_SCALE"  # one setting for a slow or busy machine (README)


def timeout_scale() -> float:
    """How many times longer than written every launch (and a lesson's cell) may run:
    DDP_COURSE_TIMEOUT_SCALE, 1 when unset."""
    value = os.environ.get(TIMEOUT_SCALE, "1")
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_SCALE}={value!r}: expected a number, such as 2") from None
    if not scale >= 1:
        raise ValueError(f"{TIMEOUT_SCALE}={value!r}: expected 1 or more (a factor on every "
                         "launch's timeout)")
    return scale


def _launch(build, script, args, timeout, out, expect_failure, echo, env, cwd, cues=()):
    timeout = timeout * timeout_scale()
    cwd = course_root() if cwd is None else cwd
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
    processes = build(args)
    # torch's own switches given in `env` are part of the command a learner types
    typed = [f"{k}={v}" for k, v in (env or {}).items() if k.startswith("TORCH_")]
    for p in processes:
        p.shown = [*typed, *p.shown]
    command = "\n".join(shlex.join(p.shown) for p in processes)

    default_env = launch_environment()
    base_env = {**default_env, **(env or {})}
    if echo:
        for p in processes:
            if p.start_when is None:  # (the others are shown as they start)
                print(f"{p.host}$ {shlex.join(p.shown)}" + (" &" if len(processes) > 1 else ""),
                      flush=True)
    try:
        returncode, output, seconds, timed_out, warm, codes = _run(
            processes, base_env, cwd, timeout, echo, default_env, cues)
        result = LaunchResult(command, returncode, output, seconds, timed_out, warm=warm,
                              exit_codes=codes)
        for p in processes:
            if p.log_dir is not None:
                result.stderr_by_rank.update(last_attempt_stderr(p.log_dir))
        if out_path is not None and out_path.is_file():  # a failed run may have written one
            try:
                result.data = json.loads(out_path.read_text())
            except json.JSONDecodeError:
                if result.ok:
                    raise
    finally:
        if out_folder is not None:
            shutil.rmtree(out_folder, ignore_errors=True)
        for p in processes:
            if p.log_dir is not None:
                shutil.rmtree(p.log_dir, ignore_errors=True)

    record(result, cwd)
    shown = command.replace("\n", " & ")
    if timed_out:
        if expect_failure:
            return result
        raise LaunchTimeout(
            f"`{shown}` did not finish within {timeout:g} s and was killed "
            f"(its whole process tree).\n(On a slow or busy machine, give every launch more "
            f"time: {TIMEOUT_SCALE}=2, README.)\n{result.summary()}", result)
    if expect_failure:
        if result.ok:
            raise LaunchError(f"`{shown}` was expected to fail but exited 0.", result)
        return result
    if not result.ok:
        raise LaunchError(
            f"`{shown}` failed with exit status {returncode} after {seconds:.1f} s.\n"
            f"{result.summary()}", result)
    if out_path is not None and result.data is None:
        raise LaunchError(f"`{shown}` exited 0 but wrote no results to {out_path}.", result)
    if echo:
        print(f"[launch] finished in {seconds:.1f} s", flush=True)
    return result


def _start(p: _Process, base_env: dict, cwd, default_env: dict | None):
    """Start one process: forked from the warm server when one can be used
    (tools/zygote.py: a torchrun whose workers are forked too, or a `python SCRIPT`, each
    less its seconds of `import torch`), else a new one."""
    env = {**base_env, **p.env}
    warm = None
    argv = p.inside or p.argv
    if default_env is not None and argv[0] == sys.executable and len(argv) > 1:
        from tools import zygote

        if argv[1:3] == ["-m", "torch.distributed.run"]:
            warm = zygote.start(argv[3:], cwd, env, default_env, p.namespaces)
        elif not argv[1].startswith("-"):
            warm = zygote.start_script(argv[1], argv[2:], cwd, env, default_env,
                                       namespaces=p.namespaces)
    if warm is not None:
        return warm
    return subprocess.Popen(
        p.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        bufsize=1, start_new_session=True,  # its own group, killed as one on timeout
    )


def _run(processes, base_env, cwd, timeout, echo, default_env=None, cues=()):
    """Run the processes together; stream their lines; stop them all at the deadline,
    or as soon as one of several fails (unless its failure is its own: `on_its_own`). A
    process with a `start_when` starts once that says True (checked every 0.2 s at most).
    Each of `cues`, (when, action, what), runs `action()` once `when()` says True, and
    the output says `what` then (a cable pulled, in lesson 26).
    Returns (returncode, output, seconds, timed_out, warm, each one's exit status: None
    if it never started or was stopped) where returncode is the first non-zero exit
    status seen, or 0."""
    start = time.monotonic()
    deadline = start + timeout
    lines: queue.Queue = queue.Queue()
    running: list = [None] * len(processes)

    def begin(k):
        p = processes[k]
        proc = _start(p, base_env, cwd, default_env)
        prefix = f"[{p.label}]" if p.label else ""
        if p.label and p.label.startswith("node"):
            prefix += " "
        elif p.label:
            prefix += ":"

        def pump(proc=proc, prefix=prefix):
            for line in proc.stdout:
                lines.put(prefix + line)
            lines.put(None)

        # Reader threads fill the queue; this thread prints, so that a notebook shows
        # the lines in the cell that launched the run.
        threading.Thread(target=pump, daemon=True).start()
        running[k] = proc

    waiting = [k for k, p in enumerate(processes) if p.start_when is not None]
    for k in range(len(processes)):
        if k not in waiting:
            begin(k)
    captured: list[str] = []
    open_streams, timed_out, returncode = len(processes) - len(waiting), False, 0

    def started():
        return [(proc, p) for proc, p in zip(running, processes) if proc is not None]

    def say(what):  # the launcher's own line, in the output as it happens
        captured.append(f"[launch] {what}\n")
        if echo:
            print(captured[-1], end="", flush=True)

    cues = list(cues)
    while open_streams or waiting or any(proc.poll() is None for proc, _ in started()):
        if time.monotonic() >= deadline:
            timed_out = True
            break
        for cue in list(cues):
            when, action, what = cue
            if when():
                cues.remove(cue)
                action()
                say(what)
        for k in list(waiting):
            if processes[k].start_when():
                waiting.remove(k)
                begin(k)
                open_streams += 1
                say(f"started now: {processes[k].host or 'here'}$ "
                    f"{shlex.join(processes[k].shown)}")
        line = ""
        if open_streams:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                pass
        elif waiting:
            time.sleep(0.05)
        else:  # every stream is closed: wait for the processes themselves, not a tick
            for proc, _ in started():
                try:
                    proc.wait(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        if line is None:
            open_streams -= 1
        elif line:
            captured.append(line)
            if echo:
                print(line, end="", flush=True)
        failed = [proc.returncode for proc, p in started()
                  if proc.poll() not in (None, 0) and not p.on_its_own]
        if failed and not returncode:
            returncode = failed[0]
            waiting.clear()  # what has not started yet never will
            for proc, _ in started():  # the others would wait for the failed one forever
                if proc.poll() is None:
                    kill_tree(proc)
    alive = [proc for proc, _ in started()]
    stacks = where_they_are(alive) if timed_out else ""
    codes = [None if proc is None else proc.poll() for proc in running]
    for proc in alive:
        if proc.poll() is None:
            kill_tree(proc)
    # Whatever a stopped run printed before the end is part of the story: read each stream
    # to its end (a run that ended by itself has none left open, so this costs nothing).
    drain_until = time.monotonic() + DRAIN_S
    while open_streams and time.monotonic() < drain_until:
        try:
            line = lines.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is None:
            open_streams -= 1
        elif line:
            captured.append(line)
            if echo and not timed_out:
                print(line, end="", flush=True)
    if timed_out:
        captured.append(stacks)
        if echo:
            print(f"[launch] timed out after {timeout:g} s: killed the run", flush=True)
    for proc in alive:
        proc.stdout.close()
    if not returncode and not timed_out:
        returncode = next((proc.returncode for proc in alive if proc.returncode), 0)
    warm = bool(alive) and all(type(proc).__name__ == "WarmProcess" for proc in alive)
    return (None if timed_out else returncode), "".join(captured), \
        time.monotonic() - start, timed_out, warm, codes


LOG = "DDP_COURSE_LAUNCH_LOG"  # a file to which every launch adds a line of JSON


def record(result: LaunchResult, cwd) -> None:
    """Where LOG names a file, add this launch to it: its command, how it ended, its output
    and JSON, and whether it was warm (tools/compare_launches.py compares two such logs)."""
    path = os.environ.get(LOG)
    if not path:
        return
    from tools import zygote

    line = json.dumps({"command": result.command, "cwd": str(cwd), "warm": result.warm,
                       "why_cold": None if result.warm else zygote.why_cold,
                       "returncode": result.returncode, "timed_out": result.timed_out,
                       "seconds": round(result.seconds, 3), "output": result.output,
                       "data": result.data})
    with open(path, "a") as f:
        f.write(line + "\n")


def last_attempt_stderr(log_dir: Path) -> dict[int, str]:
    """Each local rank's stderr in torchrun's last attempt:
    LOG_DIR/<run id>/attempt_<n>/<local rank>/stderr.log (torch 2.13)."""
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    found = {}
    for file in attempts[-1].glob("*/stderr.log"):
        if file.parent.name.isdigit():
            found[int(file.parent.name)] = file.read_text(errors="replace")
    return found


def py_spy() -> str | None:
    """The py-spy program next to this Python (a virtual environment's bin/) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def where_they_are(running: list[subprocess.Popen], limit: float = STACKS_LIMIT_S) -> str:
    """The Python stack (every thread) of each worker and the processes it started, taken
    with `py-spy dump` before a timed-out run is killed: where a hang sits, even when
    nothing was printed. torchrun itself is left out (it only waits). At most `limit`
    seconds in all; without py-spy, says how to get it."""
    program = py_spy()
    if program is None:
        return "[launch] install py-spy to see where each process was stuck\n"
    pids = []
    for proc in running:
        is_torchrun = "torch.distributed.run" in proc.args
        pids += [pid for pid in ([] if is_torchrun else [proc.pid]) + descendants(proc.pid)
                 if not warm_server(pid)]
    parts, end = [], time.monotonic() + limit
    for pid in pids:
        left = end - time.monotonic()
        if left <= 0:
            parts.append("[launch] no time left for the other stacks\n")
            break
        try:
            dump = subprocess.run([program, "dump", "--pid", str(pid)], capture_output=True,
                                  text=True, errors="replace", timeout=left)
            text = dump.stdout or dump.stderr
        except (OSError, subprocess.SubprocessError) as error:
            text = f"py-spy failed: {error}\n"
        parts.append(f"[launch] stack of process {pid}:\n{text}")
    return "".join(parts)


def warm_server(pid: int) -> bool:
    """Whether `pid` is a warm torchrun's server of its workers (tools/zygote.py), which
    waits for torchrun's requests: not a rank, and not in a cold launch's tree."""
    try:
        return "-m tools.zygote --workers-of" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


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


def show_diff(old: str, new: str, cwd: str | Path | None = None) -> None:
    """Print what changed from script `old` to script `new` (paths from the course's root,
    `course_root()`), leaving out their docstrings: `-` lines are gone, `+` lines are new."""
    import difflib

    cwd = course_root() if cwd is None else cwd

    def code(path):
        text = (Path(cwd) / path).read_text()
        return text[text.index("\nimport "):].splitlines()

    for line in difflib.unified_diff(code(old), code(new), n=0, lineterm=""):
        if line.startswith("@@"):
            print()  # between the changed places
        elif not line.startswith(("---", "+++")) and line not in ("+", "-"):  # blank lines
            print(line)


def _warm_up() -> None:
    """Start the warm torchrun's server now (in the background), so that it has imported
    torch by the time a notebook makes its first launch."""
    from tools import zygote

    if zygote.usable():
        zygote.prestart(launch_environment())


_warm_up()
