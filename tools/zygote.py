"""A torchrun kept warm for the course's own launches (Linux only).

Every `torchrun` spends about a second importing torch before it starts a single worker
(`python -X importtime -m torch.distributed.run --help`): on 2 cores that is a third of a
2-rank launch, paid by each of the course's ~100 launches and by its tests' few hundred.
The launcher (tools/launch.py) therefore starts this server once per process (when it is
imported): the server imports `torch.distributed.run` and waits. For each launch it forks,
and the child runs `python -m torch.distributed.run ARGS`, the launcher's usual command
(the module's code runs again as __main__; only its imports are already done), in a
process of its own: its own session, the launch's working folder, environment, standard
output and error. The workers that torchrun then starts are new Python processes, as with
a torchrun typed at a shell. A fork after `import torch` is also what a DataLoader does for
each of its workers on Linux.

The launcher uses a warm torchrun only when the launch's environment differs from the
server's in none of the variables that Python or torch may read while starting up (names
beginning with one of READ_AT_START: TORCH_CPP_LOG_LEVEL, LOGLEVEL, PYTHONPATH, ...; a
launch that sets one gets a cold torchrun), and never where fork is unsafe (macOS) or
when DDP_COURSE_COLD_LAUNCH=1.

The same server runs a plain `python SCRIPT ARGS` for the tests that start every script
without torchrun (`run_script`), each otherwise mostly its `import torch`.

Protocol, one Unix-socket connection per launch: the client sends one JSON line
{"args", "cwd", "env"} (and "script" for a plain script) together with the write end of its
output pipe, or of its stdout's and its stderr's (SCM_RIGHTS); the
server answers "pid N" once the child exists and "exit CODE" (negative: killed by that
signal, as `subprocess` reports it) once it has reaped it.

    python -m tools.zygote SOCKET_PATH PARENT_PID   (started by tools/launch.py)
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

START_TIMEOUT_S = 60.0
OFF = "DDP_COURSE_COLD_LAUNCH"
READ_AT_START = ("TORCH", "PYTORCH", "C10", "PYTHON", "LOGLEVEL", "OMP", "MKL", "KMP",
                 "OPENBLAS", "CUDA", "NCCL", "GLOO", "LD_", "MALLOC", "DDP_COURSE")


def same_start(env: dict, other: dict) -> bool:
    """Whether a process started in `env` starts like one started in `other`."""
    names = {k for k in env.keys() | other.keys() if env.get(k) != other.get(k)}
    return not any(k.upper().startswith(READ_AT_START) for k in names)


def _child(request: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: become the torchrun a shell would have started (or, given a
    "script", the `python SCRIPT ARGS`), then exit."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not torchrun's
    os.setsid()  # its own group, killed as one on timeout (like start_new_session=True)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {null, out_fd, err_fd}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = request.get("script")
    code = 0
    try:
        if script is None:  # as `python -m torch.distributed.run` (its code again, as __main__)
            sys.argv = ["torchrun", *request["args"]]
            sys.path[0] = request["cwd"]
            sys.modules.pop("torch.distributed.run", None)  # its imports stay: the point
            runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        else:  # as `python SCRIPT ARGS`: the script's folder first on the path
            sys.argv = [script, *request["args"]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:  # what `sys.exit` in the console script would do
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # uncaught: its traceback from the code's own frames on
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        code = 1
    # The interpreter's own exit, without unwinding into the server's loop.
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str, parent: int) -> None:
    import torch.distributed.run  # noqa: F401  the import every torchrun pays

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through the `finally`
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".new")
    server.listen(16)
    os.rename(path + ".new", path)  # the path appears once it accepts connections
    clients: dict[int, socket.socket] = {}
    try:
        _loop(server, clients, parent)
    finally:  # also when the launcher's process died without stopping this server
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _loop(server: socket.socket, clients: dict, parent: int) -> None:
    while os.getppid() == parent:  # the launcher's process is gone: so is this server
        ready, _, _ = select.select([server], [], [], 0.05)
        if ready:
            conn, _ = server.accept()
            conn.settimeout(10)
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
                while not data.endswith(b"\n"):  # a long environment comes in pieces
                    more = conn.recv(1 << 16)
                    if not more:
                        raise ConnectionError("the launcher left mid-request")
                    data += more
            except OSError:
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                for other in clients.values():
                    other.close()
                _child(json.loads(data.decode()), fds[0], fds[-1])
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(f"pid {pid}\n".encode())
            except OSError:  # the launcher is gone; the child is reaped below all the same
                pass
            clients[pid] = conn
        while clients:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = clients.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


class WarmProcess:
    """A torchrun (or, given `script`, a `python SCRIPT ARGS`) forked by the server, with
    the part of `subprocess.Popen` the launcher uses: pid, args, stdout, poll(), wait(),
    returncode. Its standard error goes to stdout, or to a pipe of its own (`stderr`) when
    `separate_stderr`."""

    def __init__(self, server: Server, args: list[str], cwd, env: dict,
                 script: str | None = None, separate_stderr: bool = False):
        self.args = [script or "torch.distributed.run", *args]
        self.returncode = None
        pipes = [os.pipe() for _ in range(2 if separate_stderr else 1)]
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        request = {"args": args, "cwd": str(cwd), "env": env}
        if script is not None:
            request["script"] = str(script)
        try:
            self._conn.connect(server.path)
            message = json.dumps(request).encode() + b"\n"
            socket.send_fds(self._conn, [message], [write for _, write in pipes])
        finally:
            for _, write in pipes:
                os.close(write)
        self.stdout = open(pipes[0][0], errors="replace", buffering=1)
        self.stderr = open(pipes[1][0], errors="replace", buffering=1) if separate_stderr else None
        self._buffer = b""
        self.pid = int(self._line(None).split()[1])

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
            self._conn.setblocking(False)
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


class Server:
    def __init__(self, env: dict):
        self.env = dict(env)
        self.folder = tempfile.mkdtemp(prefix="ddp-course-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.zygote", self.path, str(os.getpid())],
            cwd=Path(__file__).resolve().parent.parent, env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        self.ready = False
        atexit.register(self.stop)

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(self.path):
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the server removes its socket and folder
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            os.rmdir(self.folder)
        except OSError:
            pass


_server: Server | None = None
_lock = threading.Lock()


def usable() -> bool:
    return (sys.platform == "linux" and os.environ.get(OFF, "") in ("", "0")
            and hasattr(socket, "send_fds"))


def prestart(default_env: dict) -> None:
    """Start the server without waiting for it."""
    global _server
    with _lock:
        if _server is None and usable():
            _server = Server(default_env)


def _server_for(env: dict, default_env: dict) -> Server | None:
    """The running server, started on first use with `default_env` (the environment of a
    launch that sets no variables of its own), if a process started in `env` may come
    from it; else None."""
    global _server
    if not usable():
        return None
    with _lock:
        if _server is None:
            _server = Server(default_env)
        if not _server.ready:
            _server.ready = _server.wait_ready()
            if not _server.ready:
                _server.stop()
                raise RuntimeError("the warm torchrun server did not start")
        if not same_start(env, _server.env) or _server.proc.poll() is not None:
            return None
        return _server


def start(torchrun_args: list[str], cwd, env: dict, default_env: dict):
    """A warm torchrun running `torchrun_args`, or None (the caller starts a cold one) when
    none can be used for this environment."""
    server = _server_for(env, default_env)
    return None if server is None else WarmProcess(server, torchrun_args, cwd, env)


def run_script(script, args: list[str], cwd, env: dict,
               timeout: float) -> subprocess.CompletedProcess | None:
    """`python SCRIPT ARGS` in a warm interpreter, reported as `subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)` would; None (the caller runs a cold
    one) when none can be used for this environment. For the course's checks that start
    every script without torchrun: each is otherwise mostly `import torch`."""
    server = _server_for(env, env)
    if server is None:
        return None
    proc = WarmProcess(server, list(args), cwd, env, script=str(script), separate_stderr=True)
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


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
