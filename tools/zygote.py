"""Warm launches: torchrun and its workers forked from a process that has imported torch
(Linux only).

Most of a launch is processes importing torch: `import torch` and the `torch._dynamo`
that DDP's constructor imports take about 2.5 s on 2 cores, paid by torchrun and again by
every worker of each of the course's ~100 launches and its tests' few hundred. So the
launcher (tools/launch.py) starts this server once per process: the server imports torch,
torch._dynamo, torch.distributed.run and numpy, freezes what it made (gc.freeze: a forked
child's garbage collections and exit then leave those objects alone), and waits. For each
launch it forks:

* a **torchrun**: the child becomes `python -m torch.distributed.run ARGS` (runpy runs the
  module as __main__, as `python -m` does). Before that it forks once more: a second
  server, for this torchrun alone, whose children are its workers. torchrun's agent is
  stock torchrun; only the function that starts a worker (`SubprocessHandler._popen`,
  which calls `subprocess.Popen([python, "-u", SCRIPT, ...])`) asks that second server
  for a fork instead. Everything else (rendezvous, --max-restarts, @record error files,
  signals, --tee, the Root Cause report) is torchrun's own code, as in a cold launch.
* a **worker**, or a plain `python SCRIPT` (`launch(nproc=None)`, `launch_ranks`,
  `run_script`): the child becomes `python -u SCRIPT ARGS`.

**A warm worker is a cold worker.** The fork and the start of the script happen in C
(tools/warm_fork.c), in a thread that holds no Python frames: the script's `<module>` is
the first frame of its stack (py-spy, tracebacks), it runs in a fresh `__main__` through
CPython's own PyRun_AnyFileExFlags, and it ends as Python's main() ends (Py_FinalizeEx,
atexit, then exit()). Before it runs, the child (`become`) takes the launch's session,
folder, environment and standard streams; closes every file the server held; resets
signals (and takes the ignored ones, mask, umask and CPU affinity of the launching
process); reseeds what a new process seeds itself (torch's default generator, numpy's);
sets torch's and OpenBLAS's thread counts from OMP_NUM_THREADS (torchrun sets it; they
read it only at import); hides torch._dynamo until the script imports it, so that the
variable its import sets (TORCHINDUCTOR_CACHE_DIR) appears only where a cold process
would have it (`_hide`); and sets sys.argv, sys.orig_argv, sys.path[0] and __file__ as
Python would. It also rewrites its /proc/self/cmdline (py-spy's header, `ps`) and
/proc/self/environ (read by lesson 25's `local_ranks`) over room the server was started
with. What still differs is listed in tests/test_warm.py, with how each is handled.

A launch gets cold processes instead when its environment differs from the server's in a
variable that Python, torch or a library reads while starting up (measured: what the
server's imports look up, `startup_variables`; torchrun's
own variables for its workers are read later, WORKER_VARIABLES), when the server declines
(its room for cmdline and environ is too small), where the C part cannot be built (no C
compiler or Python headers), on macOS, and with DDP_COURSE_COLD_LAUNCH=1.

Protocol, one Unix-socket connection per process: the client sends one JSON line and
three file descriptors (the child's stdin, stdout, stderr; SCM_RIGHTS); the server answers
"pid N" once the child exists (and leads its own session) and "exit CODE" (negative:
killed by that signal, as `subprocess` reports it) once it has ended, or "cold REASON"
when it declines. The server reaps the child only when the client has closed the
connection, so that its process id is not reused while the client may still signal it.

    python -m tools.zygote SOCKET_PATH PARENT_PID ROOM   (started by tools/launch.py)
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import zipfile
from pathlib import Path

START_TIMEOUT_S = 90.0
OFF = "DDP_COURSE_COLD_LAUNCH"
# What the server imports once: what a worker of the course imports anyway.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed.run", "numpy")
# Variables read while the process starts, before any import can be watched: the dynamic
# loader's and the C library's (LD_PRELOAD, GLIBC_TUNABLES, MALLOC_*, the locale's: unseen
# by `startup_variables`) and Python's own.
PYTHON_START = ("PYTHON", "LANG", "LC_", "TZ", "LD_", "GLIBC_", "MALLOC_")
# Names among those that are read only when used (a process group, a rendezvous, a
# torch.load): a warm process sees them as a cold one does. The server's imports look
# none of them up (tests/test_warm.py shows it, and what each one does, warm and cold).
READ_WHEN_USED = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE", "GLOO_SOCKET_IFNAME",
                  "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
                  "CUDA_VISIBLE_DEVICES")  # CUDA's: the server never initialises CUDA
# A running server's socket, for the launchers of child processes (the lessons' kernels
# under `make course` and `make test`): they use it instead of starting their own.
SHARED = "DDP_COURSE_ZYGOTE"
# What torchrun adds for each worker, read when the worker uses it (not at import).
WORKER_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
                    "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                    "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
WORKER_PREFIXES = ("TORCHELASTIC_",)
# Read at start-up, and applied by `become` to a warm process: torch's thread count.
APPLIED = ("OMP_NUM_THREADS",)
ROOM_VARIABLE = "DDP_COURSE_ZYGOTE_ROOM"
ENV_ROOM = 64 * 1024  # bytes for a child's /proc/self/environ
ARGV_ROOM = 4000  # bytes for its /proc/self/cmdline (the kernel shows one page at most)
SOURCE = Path(__file__).with_name("warm_fork.c")
GETENV_LOG = Path(__file__).with_name("getenv_log.c")


def start_differences(env: dict, other: dict, read_at_start: frozenset,
                      worker: bool = False, set_by_imports: dict | None = None) -> list[str]:
    """The variables read at start-up (`read_at_start`, and PYTHON_START) in which `env`
    differs from `other`: a process started in one would not start like one started in the
    other. With `worker`, torchrun's variables for its workers may differ too;
    `set_by_imports` is what the server's imports put in its environment (a launch may
    hold the same values)."""
    found = []
    for name in sorted(env.keys() | other.keys()):
        if env.get(name) == other.get(name) or name in READ_WHEN_USED or name == SHARED:
            continue
        if name in APPLIED and str(env.get(name, "")).isdigit() and int(env[name]) > 0:
            continue  # `become` sets it; a value it cannot set sends the launch cold
        if set_by_imports and env.get(name) == set_by_imports.get(name, ...):
            continue
        if (worker and name not in read_at_start
                and (name in WORKER_VARIABLES or name.startswith(WORKER_PREFIXES))):
            continue
        if (name in read_at_start or name.upper().startswith(PYTHON_START)
                or any(p.endswith("*") and name.startswith(p[:-1]) for p in read_at_start)):
            found.append(name)
    return found


# ---------------------------------------------------------------- the C part, built once

def _cache_folders() -> list[Path]:
    found = []
    if sys.prefix != sys.base_prefix:  # a virtual environment (the course's .venv)
        found.append(Path(sys.prefix) / "share" / "ddp-course")
    found.append(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddp-course")
    found.append(Path(tempfile.gettempdir()) / f"ddp-course-{os.getuid()}")
    return found


def library(source: Path = SOURCE, link: tuple = ("-lpthread",)) -> Path:
    """A C file of tools/ (warm_fork.c unless told) compiled for this Python, built on first
    use (a second or so) into the virtual environment (else ~/.cache/ddp-course). Raises
    RuntimeError saying why when it cannot be built."""
    text = source.read_bytes()
    include = sysconfig.get_paths()["include"]
    key = hashlib.sha256(text + sys.version.encode() + include.encode()).hexdigest()[:16]
    if not Path(include, "Python.h").is_file():
        raise RuntimeError(f"no Python.h in {include} (the Python headers: python3-dev)")
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    errors = []
    for folder in _cache_folders():
        target = folder / f"{source.stem}-{key}.so"
        if target.is_file():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{source.stem}-{key}-{os.getpid()}.so"
            done = subprocess.run([*compiler, "-shared", "-fPIC", "-O2", f"-I{include}",
                                   "-o", str(partial), str(source), *link],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as error:
            errors.append(f"{folder}: {error}")
            continue
        if done.returncode == 0:
            os.replace(partial, target)  # whole or not at all, if several build at once
            return target
        errors.append(f"{' '.join(compiler)} failed: {(done.stderr or done.stdout).strip()}")
        break  # the compiler, not the folder, is the problem
    raise RuntimeError(f"cannot build tools/{source.name}: " + "; ".join(errors))


# What a process of the preloaded modules looks up while importing them: every getenv
# (LD_PRELOAD of tools/getenv_log.c) and every os.environ lookup by name, one a line; a
# scan of the whole environment (its items, or a copy) is written as "@scan FILE", FILE
# the scanning module's, whose prefix SCANNED_PREFIXES must then name.
_WATCH = """\
import os, sys
seen = []
environ = type(os.environ)
original_get, original_iter = environ.__getitem__, environ.__iter__
def looked_up(self, key):
    caller = sys._getframe(1).f_code
    if not (caller.co_name == "__iter__" or caller.co_filename.endswith("os.py")):
        seen.append(key)
    return original_get(self, key)
def scanned(self):
    frame = sys._getframe(1)
    while frame.f_code.co_filename.endswith(("_collections_abc>", "os.py")):
        frame = frame.f_back
    seen.append("@scan " + frame.f_code.co_filename)
    return original_iter(self)
environ.__getitem__, environ.__iter__ = looked_up, scanned
for name in sys.argv[2:]:
    __import__(name)
environ.__getitem__, environ.__iter__ = original_get, original_iter
with open(sys.argv[1], "a") as log:
    log.write("\\n".join(seen) + "\\n")
"""
# The prefixes of the variables that the preloaded imports read by scanning the whole
# environment (measured: tqdm's `envwrap`, for TQDM_*, is the only scan).
SCANNED_PREFIXES = {"tqdm/utils.py": "TQDM_"}


def startup_variables(env: dict | None = None, preload: tuple = PRELOAD) -> frozenset:
    """The variables that importing PRELOAD looks up, in C or in Python, and the prefixes
    of those it reads by scanning the environment (as "PREFIX*"): a process forked after
    these imports would not see a new value of any of them (the server sends a launch that
    sets one cold). Measured once for this Python and these imports (a few seconds), kept
    beside the compiled C part. Raises RuntimeError for a scan of an unknown module."""
    import torch  # noqa: F401  its version is part of what the list depends on

    shim = library(GETENV_LOG, ("-ldl",))
    key = hashlib.sha256(json.dumps([sys.version, sys.modules["torch"].__version__,
                                     preload, _WATCH]).encode()).hexdigest()[:16]
    kept = shim.with_name(f"startup-variables-{key}.txt")
    if not kept.is_file():
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "names")
            subprocess.run([sys.executable, "-c", _WATCH, log, *preload], check=True,
                           timeout=300, capture_output=True,
                           env={**(os.environ if env is None else env),
                                "LD_PRELOAD": str(shim), "GETENV_LOG": log})
            lines = set(Path(log).read_text().splitlines()) - {"", "GETENV_LOG"}
        names = {line for line in lines if not line.startswith("@scan ")}
        for line in lines - names:
            scanner = line.split(" ", 1)[1]
            prefix = next((p for f, p in SCANNED_PREFIXES.items() if scanner.endswith(f)), None)
            if prefix is None:
                raise RuntimeError(f"importing {', '.join(preload)} scans the environment in "
                                   f"{scanner}: add the prefix it reads to SCANNED_PREFIXES")
            names.add(prefix + "*")
        partial = kept.with_suffix(f".{os.getpid()}")
        partial.write_text("\n".join(sorted(names)) + "\n")
        os.replace(partial, kept)
    return frozenset(kept.read_text().split())


# ------------------------------------------------------------- in the server's processes

class _Serving:
    """What a serving process holds: its socket, and the clients of its children."""
    listener: socket.socket | None = None
    parent = 0  # serve while this process is our parent
    clients: dict = {}  # pid -> the connection that asked for it
    pidfds: dict = {}  # pidfd -> pid: poll wakes up when a child ends
    told: dict = {}  # connection fd -> pid: told how its child ended, not yet reaped
    env: dict = {}  # the environment this process started its work in
    set_by_imports: dict = {}  # what the server's imports added to its environment
    imports_found_tempdir = False  # whether they looked up the temporary folder
    import_again: dict = {}  # {module: (variables its import set, it looked up tempdir)}
    read_at_start: frozenset = frozenset()  # what they looked up (startup_variables)
    worker_server = False  # a torchrun's own server (its children are workers)
    stop = threading.Event()


def _room() -> tuple[int, int, int, int]:
    """(arg_start, arg_end, env_start, env_end): where this process's argument and
    environment strings lie (/proc/self/stat, fields 48 to 51)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return tuple(int(fields[i]) for i in range(45, 49))


def _retitle(argv: list[str], env: dict | None) -> None:
    """Write `argv` over /proc/self/cmdline's memory (as setproctitle does: one string, the
    arguments joined by spaces, what `ps` and py-spy show) and `env` over
    /proc/self/environ's (NUL-separated, the rest NULs). The server was started with room
    for both; `_fits` checked the sizes."""
    arg_start, arg_end, env_start, env_end = _room()
    title = " ".join(argv).encode(errors="surrogateescape")[:arg_end - arg_start - 2]
    # The kernel reads a rewritten title up to its NUL when the area's last byte is not NUL.
    area = title + b"\0" + b" " * (arg_end - arg_start - len(title) - 1)
    ctypes.memmove(arg_start, area, len(area))
    if env is not None:
        block = _environ_block(env)
        ctypes.memmove(env_start, block + b"\0" * (env_end - env_start - len(block)),
                       env_end - env_start)


def _environ_block(env: dict) -> bytes:
    return b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items())


def _fits(request: dict) -> str | None:
    """Why this server cannot make the child `request` asks for look like a cold one, or
    None."""
    arg_start, arg_end, env_start, env_end = _room()
    if len(" ".join(request["orig_argv"]).encode(errors="surrogateescape")) + 2 > min(
            arg_end - arg_start, 4096):
        return "its command line is longer than the room for /proc/self/cmdline"
    if len(_environ_block(request["env"])) > env_end - env_start:
        return "its environment is larger than the room for /proc/self/environ"
    if request.get("namespaces") and os.geteuid() != 0:
        return "entering a host's namespaces needs root"
    if request["kind"] == "script":
        path = os.path.join(request["cwd"], request["script"])
        if not os.path.isfile(path) or zipfile.is_zipfile(path):
            return "its script is not a plain file (Python itself says what it is)"
    folder = (os.path.dirname(os.path.realpath(os.path.join(request["cwd"], request["script"])))
              if request["kind"] == "script" else request["cwd"])
    shadowing = _shadowing(folder)
    if shadowing:
        return (f"its folder holds {', '.join(shadowing)}, named like a module the server "
                "imported: a new process would import that file instead")
    differ = start_differences(request["env"], _Serving.env, _Serving.read_at_start,
                               _Serving.worker_server, _Serving.set_by_imports)
    if differ:
        return f"its environment differs in {', '.join(differ)}, read at start-up"
    return None


def _shadowing(folder: str) -> list[str]:
    """The files and folders in `folder` (first on a new process's sys.path) named like a
    top-level module the server has imported."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    names = {name.split(".")[0] for name in sys.modules} - {"tools", "__main__"}
    return sorted(e for e in entries if (e[:-3] if e.endswith(".py") else e) in names
                  and (e.endswith(".py") or os.path.isdir(os.path.join(folder, e, "")))
                  and e not in ("__pycache__",))


def _read_request(conn: socket.socket):
    conn.settimeout(10)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while not data.endswith(b"\n"):  # a long environment comes in pieces
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the client left mid-request")
        data += more
    request = json.loads(data.decode(errors="surrogateescape"))
    if len(fds) != 3:
        raise ConnectionError(f"{len(fds)} file descriptors instead of 3")
    request["_conn"], request["_fds"] = conn, fds
    return request


def _exit_code(info) -> int:
    """A waitid result as `subprocess` reports it: the status, or minus the signal."""
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _reap() -> None:
    """Tell each ended child's client how it ended, then leave the child a zombie until
    that client has closed the connection (it does once it has read the line): until then
    its pid and its process group stay its own, as with a `subprocess.Popen` that has not
    been waited for, so that torchrun's `os.killpg(pid, ...)` never finds it gone (nor
    another process under a reused pid). Without pidfds (Linux before 5.3), reap at once."""
    for pidfd, pid in list(_Serving.pidfds.items()):
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            info = None
        if info is None:
            continue
        os.close(pidfd)
        del _Serving.pidfds[pidfd]
        conn = _Serving.clients[pid]
        try:
            conn.sendall(f"exit {_exit_code(info)}\n".encode())
            _Serving.told[conn.fileno()] = pid  # reaped when it closes
        except OSError:  # the client is gone
            _forget(pid)
    if not hasattr(os, "pidfd_open"):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = _Serving.clients.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def _forget(pid: int) -> None:
    """Reap a child whose client has been told (or is gone), and close its connection."""
    conn = _Serving.clients.pop(pid)
    _Serving.told.pop(conn.fileno(), None)
    conn.close()
    os.waitpid(pid, 0)


def next_request():
    """(Called from C.) Wait for the next request, reaping children meanwhile. None: stop
    serving (the parent has gone). An error with one request is reported on the server's
    standard error and the server goes on: it must not stop serving the others."""
    while not _Serving.stop.is_set() and os.getppid() == _Serving.parent:
        try:
            request = _one_request()
        except Exception:  # noqa: BLE001  nothing may stop the serving thread
            traceback.print_exc()
            time.sleep(0.05)
            continue
        if request is not None:
            return request
    return None


def _one_request():
    """The next request this server can serve, or None after a wait, a child's end or a
    request it declined."""
    poller = select.poll()  # not select(): any number of file descriptors
    for fd in [_Serving.listener.fileno(), *_Serving.pidfds, *_Serving.told]:
        poller.register(fd, select.POLLIN)
    polling = 50 if _Serving.clients and not hasattr(os, "pidfd_open") else 500
    ready = {fd for fd, _ in poller.poll(polling)}
    for fd in ready & set(_Serving.told):  # the client has read how its child ended
        _forget(_Serving.told[fd])
    _reap()
    if _Serving.listener.fileno() not in ready:
        return None
    conn, _ = _Serving.listener.accept()
    try:
        request = _read_request(conn)
    except (OSError, ValueError):
        conn.close()
        return None
    reason = _fits(request)
    if reason is None:
        return request
    for fd in request["_fds"]:
        os.close(fd)
    try:
        conn.sendall(f"cold {reason}\n".encode())
    except OSError:
        pass
    conn.close()
    return None


def forked(request: dict, pid: int) -> None:
    """(Called from C, in the server.) The child exists: tell its client, once the child
    leads a process group of its own (its first step), as after `Popen(...,
    start_new_session=True)`: a `killpg(pid)` from then on reaches it."""
    for fd in request["_fds"]:
        os.close(fd)
    conn = request["_conn"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                break
        except ProcessLookupError:
            break
        time.sleep(0.0002)
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:  # the client is gone; the child is reaped all the same
        pass
    _Serving.clients[pid] = conn
    try:
        _Serving.pidfds[os.pidfd_open(pid)] = pid
    except (AttributeError, OSError):  # no pidfd (Linux before 5.3): _reap polls
        pass


def stopped() -> None:
    """(Called from C.) The serving thread has stopped."""
    _Serving.stop.set()


def _let_go() -> None:
    """In a child: close what the server held (its socket, its clients' connections)."""
    for conn in _Serving.clients.values():
        conn.close()
    for pidfd in _Serving.pidfds:
        os.close(pidfd)
    if _Serving.listener is not None:
        _Serving.listener.close()
    _Serving.clients, _Serving.pidfds, _Serving.told, _Serving.listener = {}, {}, {}, None


def _new_stdio(unbuffered: bool) -> None:
    """sys.stdin, sys.stdout and sys.stderr as a new interpreter makes them over fds 0-2
    (Python/pylifecycle.c, create_stdio): -u or PYTHONUNBUFFERED writes through."""
    import io

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, f"__{name}__") or getattr(sys, name)
        setattr(_Serving, f"old_{name}", old)
        writing = fd > 0
        buffered = not (unbuffered and writing)
        buffer = open(fd, "wb" if writing else "rb", buffering=-1 if buffered else 0,
                         closefd=False)
        raw = buffer.raw if buffered else buffer
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(buffer, old.encoding, old.errors, newline="\n",
                                  line_buffering=not unbuffered and (raw.isatty() or fd == 2),
                                  write_through=unbuffered)
        stream.mode = "w" if writing else "r"
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reset_signals(process: dict) -> None:
    """Signal handlers as a new interpreter sets them, over what it inherits from the
    launching process (the signals it ignores stay ignored; CPython installs its SIGINT
    handler only where SIGINT was not ignored), then that process's signal mask."""
    ignored = set(process.get("ignored", []))
    for number in signal.valid_signals():
        if number in ignored:
            handler = signal.SIG_IGN
        else:
            handler = {signal.SIGINT: signal.default_int_handler,
                       signal.SIGPIPE: signal.SIG_IGN,
                       signal.SIGXFSZ: signal.SIG_IGN}.get(number, signal.SIG_DFL)
        try:
            if signal.getsignal(number) is not handler:
                signal.signal(number, handler)
        except (OSError, ValueError, RuntimeError):  # SIGKILL, SIGSTOP, real-time ones
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, process.get("mask", []))


def _fresh_main() -> None:
    """An empty __main__, as Python makes one (runpy and PyRun fill in the rest)."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__annotations__ = {}
    main.__builtins__ = builtins
    sys.modules["__main__"] = main


def _forget_tools() -> None:
    """The server's own modules (this one, `tools`) are not a worker's: a script's own
    `tools` must import from its folder."""
    for name in [n for n in sys.modules if n == "tools" or n.startswith("tools.")]:
        del sys.modules[name]
    root = str(Path(__file__).resolve().parent.parent)
    sys.path_importer_cache.pop(root, None)


def become(request: dict):
    """(Called from C, in the child, which already leads a session of its own, as after
    Popen's start_new_session.) Become the process the request asks for; return what C is
    to do: run a file or a module. Signals are blocked until the handlers are set."""
    stdin, stdout, stderr = request["_fds"]
    conn = request["_conn"]
    _let_go()
    conn.close()
    if request.get("namespaces"):
        _enter(request["namespaces"])
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    for fd in {stdin, stdout, stderr} - {0, 1, 2}:
        os.close(fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing left open from the server
    os.chdir(request["cwd"])
    env = request["env"]
    _LIBC.clearenv()  # the C environment too, also what C code set behind os.environ
    os.environ.clear()
    os.environ.update(env)
    for name, (variables, tempdir) in _Serving.import_again.items():
        _hide(name, variables, tempdir)
    _inherit(request.get("process", {}))
    _new_stdio(bool(request.get("unbuffered")) or bool(env.get("PYTHONUNBUFFERED")))
    _fresh_main()
    _forget_tools()
    _fresh_state()
    _threads(env)
    sys.orig_argv = list(request["orig_argv"])
    _retitle(sys.orig_argv, env)  # what it was started with, as the kernel shows it
    if request["kind"] == "module":  # a notebook kernel: gone with its server, as with
        _LIBC.prctl(1, signal.SIGKILL)  # papermill (ipykernel's parent poller cannot see it)
    gc.collect()  # what the server's code left, now, not during the script
    _reset_signals(request.get("process", {}))  # last: handlers set, then unblocked
    if request["kind"] in ("torchrun", "module"):  # `python -m MODULE ARGS`
        module = request.get("module", "torch.distributed.run")
        sys.argv = ["-m", *request["args"]]  # runpy puts the module's path first
        sys.modules.pop(module, None)  # it runs again, as __main__
        sys.path[0] = os.getcwd()
        return _start_worker_server() if request["kind"] == "torchrun" else ("run_module", module)
    path = _script_path(request["script"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    return ("run_file", path)


def _script_path(script: str) -> str:
    """The script's path as CPython makes it absolute (_Py_abspath: the folder joined
    before a relative path, which is not normalised: `./a/../b.py` stays)."""
    return script if os.path.isabs(script) else os.path.join(os.getcwd(), script)


_LIBC = ctypes.CDLL(None, use_errno=True)


def process_attributes() -> dict:
    """What a child of this process inherits besides its environment and folder, for a
    warm child to take: the signals this process ignores (Popen resets only SIGPIPE and
    SIGXFSZ; exec keeps the others ignored), this thread's signal mask, the umask, the
    CPU affinity (OpenMP and OpenBLAS size their pools from it)."""
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP)
               and signal.getsignal(s) is signal.SIG_IGN]
    mask = [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])]
    umask = os.umask(0o22)
    os.umask(umask)
    return {"ignored": ignored, "mask": mask, "umask": umask,
            "affinity": sorted(os.sched_getaffinity(0))}


def _inherit(process: dict) -> None:
    if "umask" in process:
        os.umask(process["umask"])
    if process.get("affinity"):
        try:
            os.sched_setaffinity(0, process["affinity"])
        except OSError:
            pass


def _hide(name: str, variables: dict, tempdir: bool) -> None:
    """Take the module `name`, whose import set `variables` in the environment, out of
    sight (sys.modules and its parent package) until this process imports it: torch's
    lazy attribute (`torch._dynamo`, as DDP's constructor uses it) or an import statement
    then finds it through _ImportAgain, which hands the module back without running it
    again and does to the environment what the import did (torch._dynamo's sets
    TORCHINDUCTOR_CACHE_DIR, from the temporary folder), as in a cold process. A process
    that never imports it, such as torchrun's agent, never has those variables set."""
    module = sys.modules.pop(name, None)
    if module is None:  # hidden already (a worker of a warm torchrun's agent)
        return
    parent, _, child = name.rpartition(".")
    if parent and vars(sys.modules[parent]).get(child) is module:
        delattr(sys.modules[parent], child)
    sys.meta_path.insert(0, _ImportAgain(name, module, variables, tempdir))


class _ImportAgain(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, name, module, variables: dict, tempdir: bool):
        self.name, self.module, self.variables, self.tempdir = name, module, variables, tempdir
        self.spec = module.__spec__

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=self.spec.origin)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        sys.meta_path.remove(self)
        module.__spec__ = self.spec  # as it was: the import system set ours
        missing = {k: v for k, v in self.variables.items() if k not in os.environ}
        os.environ.update(missing)  # a cold import sets them only where they are unset
        if missing and self.tempdir:
            tempfile.gettempdir()


def _fresh_state() -> None:
    """What the server's modules computed from the server itself, computed again for this
    process, as a new one would: its temporary folder, host name (lesson 32's hosts), the
    multiprocessing folder and key, logging's start time."""
    if "tempfile" in sys.modules:  # unset, or found again under this process's TMPDIR
        sys.modules["tempfile"].tempdir = None
        if _Serving.imports_found_tempdir:
            sys.modules["tempfile"].gettempdir()
    if "platform" in sys.modules:
        sys.modules["platform"]._uname_cache = None
    if "multiprocessing.process" in sys.modules:
        process = sys.modules["multiprocessing.process"]
        process.ORIGINAL_DIR = os.getcwd()
        process.current_process().authkey = os.urandom(32)
    if "logging" in sys.modules:
        logging = sys.modules["logging"]
        logging._startTime = time.time()
        # Handlers made at import (torch's) write to the streams of the moment, as they do
        # in a process whose imports come after its streams are set (a kernel's OutStream)
        for handler in [*logging.root.handlers, *(
                h for logger in logging.Logger.manager.loggerDict.values()
                for h in getattr(logger, "handlers", []))]:
            stream = getattr(handler, "stream", None)
            for name in ("stdout", "stderr"):
                if stream is getattr(_Serving, f"old_{name}", None):
                    handler.stream = _Current(name)
    _reseed()


class _Current:
    """A stream that is whatever sys.stdout (or sys.stderr) is when it is written to."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attribute):
        return getattr(getattr(sys, self.name), attribute)


def _threads(env: dict) -> None:
    """torchrun's OMP_NUM_THREADS, which torch and numpy's OpenBLAS read when imported: set
    it in both, as a process started with it would have them."""
    threads = env.get("OMP_NUM_THREADS", "")
    if not (threads.isdigit() and int(threads) > 0):
        return
    if "torch" in sys.modules and sys.modules["torch"].get_num_threads() != int(threads):
        sys.modules["torch"].set_num_threads(int(threads))
    if "OPENBLAS_NUM_THREADS" in env or "GOTO_NUM_THREADS" in env:
        return  # OpenBLAS reads those first (the server had the same)
    for setter in _openblas_setters():
        setter(int(threads))


def _openblas_setters() -> list:
    """The thread-count setters of the OpenBLAS libraries this process has loaded."""
    found = []
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.split()[-1]}
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):
            if hasattr(library, name):
                found.append(getattr(library, name))
                break
    return found


def _enter(host: dict) -> None:
    """Enter a host of lesson 32 as tools/cluster.py's `on` does (`unshare --uts --mount
    nsenter --net=NETNS`, then its /etc/hosts and resolv.conf bound in, its host name)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result, what):
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    check(libc.unshare(0x04000000 | 0x00020000), "unshare(CLONE_NEWUTS | CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, 16384 | (1 << 18), None), "mount --make-rprivate /")
    fd = os.open(host["netns"], os.O_RDONLY)
    try:
        check(libc.setns(fd, 0x40000000), f"setns({host['netns']}, CLONE_NEWNET)")
    finally:
        os.close(fd)
    check(libc.mount(host["hosts"].encode(), b"/etc/hosts", None, 4096, None),
          "mount --bind /etc/hosts")
    if os.path.exists("/etc/resolv.conf"):
        check(libc.mount(host["resolv"].encode(), b"/etc/resolv.conf", None, 4096, None),
              "mount --bind /etc/resolv.conf")
    socket.sethostname(host["hostname"])


def _gpu_libraries() -> list[str]:
    """The GPU driver libraries this process has loaded (they are loaded when CUDA or NVML
    starts, which must not happen before a fork whose child uses the GPU)."""
    names = ("libcuda.so", "libnvidia-ml.so", "libamdhip64.so", "libhsa-runtime64.so")
    with open("/proc/self/maps") as maps:
        return sorted({name for line in maps for name in names if name in line})


def _reseed() -> None:
    """A new process seeds these itself, each differently: a fork would share them."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    random = sys.modules.get("numpy.random")
    if random is not None:
        random.seed()


# ------------------------------------------------- a torchrun and the server of its workers

class _Agent:
    address: str | None = None  # the socket of this torchrun's own server
    env: dict = {}
    pid = 0  # this torchrun's


def _start_worker_server():
    """In a warm torchrun, before torchrun runs: open the socket of a server for its
    workers, then fork it (`after_fork`)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # An abstract name: nothing on disk to remove, gone with its last holder.
    address = f"\0ddp-course-workers-{os.getpid()}-{time.monotonic_ns()}"
    listener.bind(address)
    listener.listen(64)
    _Serving.listener, _Agent.address, _Agent.env = listener, address, dict(os.environ)
    _Agent.pid = os.getpid()
    return ("fork",)


def after_fork(pid: int):
    """(Called from C, signals blocked.) In the torchrun (pid > 0): run torchrun, its
    workers forked by the server forked just now. In that server (pid 0): serve."""
    if pid == 0:
        _Serving.parent = _Agent.pid  # torchrun's pid, taken before the fork
        _Serving.env = dict(os.environ)
        _Serving.worker_server = True
        os.setpgid(0, 0)  # out of torchrun's group: a signal to the group is not for it
        if _LIBC.prctl(1, signal.SIGKILL) != 0 or os.getppid() != _Serving.parent:
            os._exit(0)  # PR_SET_PDEATHSIG: gone with torchrun (or torchrun is gone already)
        null = os.open(os.devnull, os.O_RDWR)  # not torchrun's output: the launcher must see
        for fd in (0, 1, 2):  # its end when torchrun ends
            os.dup2(null, fd)
        os.close(null)
        _retitle([sys.orig_argv[0], "-m", "tools.zygote", "--workers-of", str(_Serving.parent)],
                 None)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        return ("serve",)
    _Serving.listener.close()
    _Serving.listener = None
    _patch_torchrun()
    return ("run_module", "torch.distributed.run")


def _patch_torchrun() -> None:
    """torchrun starts each worker with SubprocessHandler._popen: ask our worker server
    instead, where it can make a worker that a cold one would be."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler,
    )

    handler = subprocess_handler.SubprocessHandler
    cold = handler._popen

    def _popen(self, args, env):
        warm = _start_worker(tuple(map(str, args)), env, self._stdout, self._stderr)
        return warm if warm is not None else cold(self, args, env)

    handler._popen = _popen


def _start_worker(args: tuple, env: dict, stdout, stderr):
    """A warm `python -u SCRIPT ARGS` for torchrun, or None (torchrun's Popen then)."""
    if (len(args) < 3 or args[0] != sys.executable or args[1] != "-u"
            or args[2].startswith("-") or _Agent.address is None
            or start_differences(env, _Agent.env, _Serving.read_at_start, worker=True)):
        return None
    request = {"kind": "script", "script": args[2], "args": list(args[3:]),
               "orig_argv": list(args), "cwd": os.getcwd(), "env": env, "unbuffered": True,
               "process": process_attributes()}
    fds = [0, stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2]
    try:
        return WarmProcess(_Agent.address, request, fds)
    except Declined:
        return None


# ------------------------------------------------------------------- the server's main()

def serve(path: str, parent: int, preload: tuple = PRELOAD) -> None:
    os.environ.pop(ROOM_VARIABLE, None)  # its bytes stay, as room for children's environs
    _retitle([sys.executable, "-m", "tools.zygote", path, str(parent)], None)
    lib = ctypes.PyDLL(str(library()))
    _Serving.read_at_start = startup_variables(preload=preload)
    # The environment before the imports: they may add to it (torch._dynamo sets
    # TORCHINDUCTOR_CACHE_DIR, which torch._inductor sets again whenever it needs it).
    _Serving.parent, _Serving.env = parent, dict(os.environ)
    for name in preload:  # what each import adds to the environment, and if it looks up
        before = dict(os.environ)  # the temporary folder (not what the server did)
        tempfile.tempdir = None
        __import__(name)
        added = {k: v for k, v in os.environ.items() if before.get(k) != v}
        if added:  # hidden in each child until it imports the module itself (_hide)
            _Serving.import_again[name] = (added, tempfile.tempdir is not None)
        elif tempfile.tempdir is not None:
            _Serving.imports_found_tempdir = True
    _Serving.set_by_imports = {k: v for k, v in os.environ.items() if _Serving.env.get(k) != v}
    touched = _gpu_libraries()
    if touched:  # a fork would carry the driver's state: its children could not use the GPU
        raise RuntimeError(f"importing {', '.join(preload)} loaded {', '.join(touched)}: "
                           "no warm launches (their processes could not use the GPU)")
    gc.collect()
    gc.freeze()  # the children's collections and exits leave all of this alone
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    _Serving.listener = listener
    os.rename(path + ".new", path)  # the path appears once it accepts connections

    def leave(*_):
        _Serving.stop.set()

    signal.signal(signal.SIGTERM, leave)
    lib.warm_fork_start.argtypes = [ctypes.py_object]
    if lib.warm_fork_start(sys.modules[__name__]) != 0:
        raise RuntimeError("could not start the serving thread")
    try:
        while not _Serving.stop.wait(0.2) and os.getppid() == parent:
            pass
    finally:
        if os.getppid() != parent:  # the launcher's process is gone: nobody reads the log
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        else:  # stopped, or failed: the launcher removes the folder, after reading the log
            for name in (path, path + ".new"):
                try:
                    os.unlink(name)
                except OSError:
                    pass
        sys.stdout.flush()
        os._exit(0)  # not a finalization racing the serving thread


# -------------------------------------------------------------------------- the clients

class Declined(RuntimeError):
    """The server will not fork this one (the reason is the message): start it cold."""


class WarmProcess:
    """A process forked by a server, with the part of `subprocess.Popen` the launcher and
    torchrun use: pid, args, poll(), wait(), send_signal(), terminate(), kill(),
    returncode. The caller passes the child's stdin, stdout and stderr (and keeps its own
    copies)."""

    def __init__(self, address: str, request: dict, fds: list[int]):
        self.args = request["orig_argv"]
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buffer = b""
        try:
            self._conn.connect(address)
            message = json.dumps(request).encode(errors="surrogateescape") + b"\n"
            socket.send_fds(self._conn, [message], fds)
            answer = self._line(60)
        except OSError as error:
            self._conn.close()
            raise Declined(f"the server did not answer: {error}") from error
        if answer is None or not answer.startswith("pid "):
            self._conn.close()
            raise Declined(answer[5:] if answer and answer.startswith("cold ")
                           else f"the server answered {answer!r}")
        self.pid = int(answer.split()[1])

    def _line(self, timeout: float | None) -> str | None:
        while b"\n" not in self._buffer:
            self._conn.settimeout(timeout)
            try:
                chunk = self._conn.recv(256)
            except (TimeoutError, BlockingIOError):
                return None
            if not chunk:  # the server died: report the child as killed
                self._buffer += b"exit -9\n"
                break
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def poll(self):
        if self.returncode is None:
            line = self._line(0)
            if line is not None:
                self.returncode = int(line.split()[1])
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None):
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line.split()[1])
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Server:
    """The warm server of this process: started here, it leaves with this process. Its
    standard error (a start that failed, an error with one request) goes to a log file in
    its folder, read when it has stopped."""

    def __init__(self, env: dict, preload: tuple = PRELOAD):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="ddp-course-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.log = os.path.join(self.folder, "server.log")
        room = " " * ARGV_ROOM  # room for a child's command line, then for its environment
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.zygote", self.path, str(os.getpid()),
                 ",".join(preload), room],
                cwd=Path(__file__).resolve().parent.parent,
                env={**self.env, ROOM_VARIABLE: "x" * ENV_ROOM},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True)
        self.ready = False
        self.why_not: str | None = None
        atexit.register(self.stop)

    def _last_words(self) -> str:
        try:
            lines = Path(self.log).read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return f"status {self.proc.returncode}" + (f": {lines[-1]}" if lines else "")

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(self.path):
                return True
            time.sleep(0.02)
        if self.proc.poll() is not None:
            self.why_not = f"it exited with {self._last_words()}"
        else:
            self.why_not = f"it was not ready after {START_TIMEOUT_S:g} s"
        return False

    def alive(self) -> bool:
        global why_cold
        if self.proc.poll() is None:
            return True
        why_cold = f"the warm server exited with {self._last_words()}"
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the server removes its socket
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_server = None  # a Server, or a Shared one
_lock = threading.Lock()
why_cold: str | None = None  # why this process's last launch was cold


def usable() -> bool:
    return (sys.platform == "linux" and os.environ.get(OFF, "") in ("", "0")
            and hasattr(socket, "send_fds"))


def prestart(default_env: dict) -> None:
    """Start the server without waiting for it (unless SHARED names one)."""
    global _server
    with _lock:
        if _server is None and usable():
            shared = os.environ.get(SHARED)
            _server = Shared(shared) if shared else Server(default_env)


class Shared:
    """A server started by another process (`share`), found through SHARED: it checks each
    request's environment against its own, and declines those it cannot serve."""

    def __init__(self, path: str):
        self.path, self.env, self.proc, self.why_not = path, None, None, None
        self.ready = False

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(self.path):
                return True
            time.sleep(0.02)
        self.why_not = f"the shared server's socket {self.path} did not appear"
        return False

    def alive(self) -> bool:
        global why_cold
        if os.path.exists(self.path):
            return True
        why_cold = f"the shared warm server's socket {self.path} is gone"
        return False

    def stop(self) -> None:
        pass


def share(default_env: dict) -> None:
    """Start this process's server (if it has none yet) and let the processes it starts
    use it: they inherit SHARED. For `make course` and `make test`, whose lessons each run
    in a new kernel: one server for all, instead of one import of torch per lesson."""
    prestart(default_env)
    if isinstance(_server, Server):
        os.environ[SHARED] = _server.path


def _server_for(env: dict, default_env: dict):
    """The server, started on first use with `default_env` (the environment of a launch
    that sets no variables of its own) unless SHARED names one, if a process started in
    `env` may come from it; else None."""
    global _server, why_cold
    if not usable() or env.get(OFF, "") not in ("", "0"):
        why_cold = f"{OFF}=1, or not on Linux"
        return None
    with _lock:
        if _server is None:
            shared = os.environ.get(SHARED)
            _server = Shared(shared) if shared else Server(default_env)
        return _server if _ready(_server, "warm server") else None


def _ready(server, name: str) -> bool:
    """Whether `server` serves now (waiting for it once, the first time); if not, why_cold
    says why."""
    global why_cold
    if not server.ready:
        if server.why_not is not None:
            return False
        server.ready = server.wait_ready()
        if not server.ready:
            why_cold = f"the {name} did not start: {server.why_not}"
            return False
    return server.alive()


def _pipes(separate_stderr: bool):
    """(stdin, stdout, stderr) for a child and the read ends for us."""
    null = os.open(os.devnull, os.O_RDWR)  # as subprocess.DEVNULL
    out = os.pipe()
    err = os.pipe() if separate_stderr else None
    fds = [null, out[1], (err or out)[1]]
    return fds, out[0], (err[0] if err else None)


def _spawn(server: Server, request: dict, separate_stderr: bool = False):
    fds, out, err = _pipes(separate_stderr)
    global why_cold
    try:
        proc = WarmProcess(server.path, request, fds)
    except Declined as declined:
        why_cold = str(declined)
        for fd in {out, err} - {None}:
            os.close(fd)
        return None
    finally:
        for fd in set(fds):
            os.close(fd)
    proc.stdout = open(out, errors="replace", buffering=1)
    proc.stderr = open(err, errors="replace", buffering=1) if err is not None else None
    return proc


def start(torchrun_args: list[str], cwd, env: dict, default_env: dict,
          namespaces: dict | None = None):
    """A warm `python -m torch.distributed.run ARGS`, its stdout and stderr in one pipe
    (`.stdout`), or None (the caller starts a cold one). `namespaces`: a host's, to enter
    first (tools/cluster.py)."""
    server = _server_for(env, default_env)
    if server is None:
        return None
    request = {"kind": "torchrun", "args": list(torchrun_args), "cwd": str(cwd), "env": env,
               "orig_argv": [sys.executable, "-m", "torch.distributed.run", *torchrun_args],
               "namespaces": namespaces, "process": process_attributes()}
    return _spawn(server, request)


def start_script(script, args: list[str], cwd, env: dict, default_env: dict,
                 separate_stderr: bool = False, namespaces: dict | None = None):
    """A warm `python SCRIPT ARGS` (stdout and stderr in `.stdout`, or apart), or None."""
    server = _server_for(env, default_env)
    if server is None:
        return None
    request = {"kind": "script", "script": str(script), "args": list(map(str, args)),
               "cwd": str(cwd), "env": env,
               "orig_argv": [sys.executable, str(script), *map(str, args)],
               "namespaces": namespaces, "process": process_attributes()}
    return _spawn(server, request, separate_stderr)


def run_script(script, args: list[str], cwd, env: dict,
               timeout: float) -> subprocess.CompletedProcess | None:
    """`python SCRIPT ARGS` in a warm interpreter, reported as `subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)` would; None (the caller runs a cold
    one) when none can be used for this environment."""
    proc = start_script(script, args, cwd, env, env, separate_stderr=True)
    if proc is None:
        return None
    texts: dict[str, str] = {}
    readers = [threading.Thread(target=lambda name=name: texts.update(
        {name: getattr(proc, name).read()}), daemon=True) for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its session: the child and what it started
        raise
    for reader in readers:  # until the child and anything it started close the pipes
        reader.join()
    proc.stdout.close()
    proc.stderr.close()
    return subprocess.CompletedProcess(proc.args, code, texts["stdout"], texts["stderr"])


# A notebook kernel's server: the course's imports, and those of the kernel itself (the
# lessons' kernels import torch for their checks; ipykernel's own start-up imports IPython,
# zmq and tornado). Not matplotlib: it reads MPLBACKEND when imported, which ipykernel sets
# only as it starts.
KERNEL_PRELOAD = (*PRELOAD, "ipykernel.kernelapp", "nbformat")
_kernel_server: Server | None = None


def start_kernel(argv: list[str], env: dict, cwd):
    """A warm `python -m MODULE ARGS` for a notebook kernel (as jupyter_client's
    launch_kernel starts it: stdin closed, stdout and stderr this process's), from a server
    of its own (KERNEL_PRELOAD), or None (the caller starts a cold one)."""
    global _kernel_server, why_cold
    if not usable() or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return None
    with _lock:
        if _kernel_server is None:
            _kernel_server = Server(env, KERNEL_PRELOAD)
        server = _kernel_server
        if not _ready(server, "warm kernel server"):
            return None
    request = {"kind": "module", "module": argv[2], "args": list(argv[3:]), "cwd": str(cwd),
               "env": env, "orig_argv": list(argv), "process": process_attributes()}
    null = os.open(os.devnull, os.O_RDWR)
    try:
        return WarmProcess(server.path, request, [null, 1, 2])
    except Declined as declined:
        why_cold = str(declined)
        return None
    finally:
        os.close(null)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3].split(",")))
