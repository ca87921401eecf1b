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

Protocol, one Unix-socket connection per launch: the client sends one JSON line
{"args", "cwd", "env"} together with the write end of its output pipe (SCM_RIGHTS); the
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


def _child(request: dict, out_fd: int) -> None:
    """In the forked child: become the torchrun a shell would have started, then exit."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not torchrun's
    os.setsid()  # its own group, killed as one on timeout (like start_new_session=True)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(null)
    os.close(out_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["torchrun", *request["args"]]
    sys.path[0] = request["cwd"]
    code = 0
    sys.modules.pop("torch.distributed.run", None)  # its imports stay: that is the point
    try:  # as `python -m torch.distributed.run` (the module's code again, as __main__)
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # what `sys.exit` in the console script would do
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # uncaught: its traceback from torchrun's frames on
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
                data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
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
                _child(json.loads(data.decode()), fds[0])
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
    """A torchrun forked by the server, with the part of `subprocess.Popen` the launcher
    uses: pid, args, stdout, poll(), wait(), returncode."""

    def __init__(self, server: Server, args: list[str], cwd, env: dict):
        self.args = ["torch.distributed.run", *args]
        self.returncode = None
        read_fd, write_fd = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(server.path)
            message = json.dumps({"args": args, "cwd": str(cwd), "env": env}).encode() + b"\n"
            socket.send_fds(self._conn, [message], [write_fd])
        finally:
            os.close(write_fd)
        self.stdout = open(read_fd, errors="replace", buffering=1)
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


def start(torchrun_args: list[str], cwd, env: dict, default_env: dict):
    """A warm torchrun running `torchrun_args`, or None (the caller starts a cold one) when
    none can be used for this environment. The server is started, on first use, with
    `default_env`: the environment of a launch that sets no variables of its own."""
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
        return WarmProcess(_server, torchrun_args, cwd, env)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
