"""`make grade`'s oracle: a function exercise checked by the judge, answered by the student.

A function exercise's check calls the student's function on inputs and compares what comes
back with what it expects. Run in the student's kernel, the comparison could be forged (an
answer that rebinds `abs`, or wraps the grader's own record); so the checks run in the
judge (tools/judge.py), where no student's code ran, and only the calls cross over:

- the student's kernel, where the exercise's check was, waits (`serve`) on a Unix socket
  of that exercise: it looks up a name, calls a function (each call under the exercise's
  timeout), reads an attribute, iterates, in its own namespace, until the judge lets it go
  on to its next cell;
- the judge binds each name the instructor's answer defines (`Oracle.bind`) to what the
  kernel holds: data by value, anything else (a function, a DataLoader) as a `Remote`
  whose calls go to the kernel. The answer's imports are the instructor's, run here.
- the judge and the kernel take turns: at every exercise (a script exercise too) the
  kernel waits, where the check was, while the judge runs the check; the judge starts
  once the kernel waits at the first exercise (or has ended), and lets the kernel go on
  when it reaches the next one. So the checks see the answer (and the script it wrote) as
  it was right after it ran, never run while the kernel does, and a lesson that stops
  later keeps the verdicts of the exercises before.

What crosses: the judge's arguments, pickled (the judge's own data, unpickled by the
student's process); the kernel's answers, written by `torch.save` and read by
`torch.load(weights_only=True)`, which rebuilds tensors, numbers, strings and containers,
never code. An exception crosses as its class's name and message, and is raised again here
as that class when it is one Python or torch already defines. The check's expected values
and its verdict stay in the judge; the student's process sees only the inputs.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct
import sys
import time
import traceback

LIMIT = 64 << 20  # the largest answer read back
ENDED, JUDGED = "kernel-ended", "judge-done"  # files in the folder: who is done
_HEADER = struct.Struct("!Q")


class OracleError(RuntimeError):
    """The student's kernel did not answer (gone, stopped, or it sent what is not data)."""


class _Ref:
    """A kernel object named in the judge's arguments (a `Remote` passed back)."""

    def __init__(self, handle: int):
        self.handle = handle


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes | None:
    header = _exactly(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > LIMIT:
        raise OracleError(f"the kernel's answer is {size} bytes, over {LIMIT}")
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# The student's side ---------------------------------------------------------------------

def serve(folder: str, number: int, namespace: dict, seconds: float, guard=None) -> int:
    """Answer the judge's requests for exercise `number` on a Unix socket in `folder` with
    `namespace` (the kernel's), until the judge lets go (or is done), or `seconds` pass;
    the number of requests answered. `guard()`: a context for each call (its timer)."""
    import torch  # noqa: F401 (the answers are written with torch.save)

    path = os.path.join(folder, str(number))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    deadline = time.monotonic() + seconds
    handles: list = []
    answered = 0
    try:
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(folder, JUDGED)):
                break  # the judge is done (or gone): nobody will call
            listener.settimeout(0.2)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                try:
                    while True:
                        payload = _receive(conn)
                        if payload is None:
                            return answered
                        request = pickle.loads(payload)  # the judge's own, trusted
                        if request["op"] == "stop":
                            return answered
                        _send(conn, _answer(request, namespace, handles, guard))
                        answered += 1
                except OSError:  # the judge left (it stopped waiting for a call)
                    return answered
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return answered


def _answer(request: dict, namespace: dict, handles: list, guard=None) -> bytes:
    import torch

    def resolve(value):
        if isinstance(value, _Ref):
            return handles[value.handle]
        if isinstance(value, (list, tuple)):
            return type(value)(resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    saved = {k: os.environ.get(k) for k in request.get("env", {})}
    try:
        for k, v in request.get("env", {}).items():  # the check's environment, for the call
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        op = request["op"]
        if op == "get":
            if request["name"] not in namespace:
                packed = ("missing",)
            else:
                packed = _pack(namespace[request["name"]], handles)
        else:
            target = handles[request["handle"]]
            if op == "call":
                args, kwargs = resolve(request["args"]), resolve(request["kwargs"])
                if guard is None:
                    value = target(*args, **kwargs)
                else:
                    with guard():
                        value = target(*args, **kwargs)
            elif op == "getattr":
                value = getattr(target, request["name"])
            elif op == "iter":
                value = iter(target)
            elif op == "next":
                value = next(target)
            elif op == "len":
                value = len(target)
            elif op == "getitem":
                value = target[resolve(request["key"])]
            else:
                raise ValueError(f"unknown request {op!r}")
            packed = _pack(value, handles)
    except StopIteration as error:
        packed = ("stop",) if request["op"] == "next" else (
            "raised", "builtins", "RuntimeError", f"the answer raised StopIteration: {error}")
    except BaseException as error:  # noqa: BLE001 (the student's: it goes back as data)
        kind = type(error)
        answers = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(
            error.__traceback__) if f.filename.startswith("<exercise ")]
        packed = ("raised", kind.__module__, kind.__qualname__, str(error)[:2000],
                  answers[-1] if answers else None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    buffer = io.BytesIO()
    try:
        torch.save({"id": request["id"], "answer": packed}, buffer)
    except Exception as error:  # noqa: BLE001
        buffer = io.BytesIO()
        torch.save({"id": request["id"], "answer": (
            "raised", "tools.oracle", "OracleError", f"the answer could not be sent: {error}")},
            buffer)
    return buffer.getvalue()


def _is_data(value) -> bool:
    """Whether `torch.load(weights_only=True)` rebuilds `value` (so the judge can read it)."""
    import torch

    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001
        return False
    return True


def _numbers(value, depth: int = 0):
    """`value` with numpy's scalars as Python numbers and its arrays as lists (the
    answer of a function that computes with numpy), in dicts, lists and tuples."""
    if depth > 20:
        return value
    kind = type(value).__module__
    if kind == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    if type(value) in (list, tuple):
        return type(value)(_numbers(v, depth + 1) for v in value)
    if type(value) is dict:
        return {k: _numbers(v, depth + 1) for k, v in value.items()}
    return value


def _pack(value, handles: list):
    if _is_data(value):
        return ("value", value)
    plainer = _numbers(value)
    if plainer is not value and _is_data(plainer):
        return ("value", plainer)
    if type(value) in (tuple, list):
        return ("seq", type(value) is tuple, [_pack(v, handles) for v in value])
    handles.append(value)
    return ("handle", len(handles) - 1, callable(value), type(value).__qualname__)


# The judge's side -----------------------------------------------------------------------

STOPPED = "the student's kernel stopped before it could answer"


class Oracle:
    """The judge's side: the student's kernel, answering in `folder` (tools/grade.py)."""

    def __init__(self, folder: str | None, first: int | None = None,
                 wait_seconds: float = 1200.0, answer_seconds: float = 300.0):
        """Waits until the kernel is at exercise `first` (None: until it has ended), at
        most `wait_seconds`. `answer_seconds`: the most one answer may take
        (the kernel's timer for a call is shorter)."""
        self.folder, self.sock, self._id = folder, None, 0
        self.wait_seconds, self.answer_seconds = wait_seconds, answer_seconds
        self.gone = STOPPED
        self._environ = dict(os.environ)
        if folder:
            self._wait(first)

    def _wait(self, number: int | None) -> str | None:
        """The socket of exercise `number` once the kernel serves it; None once it has
        ended, or after wait_seconds."""
        deadline = time.monotonic() + self.wait_seconds
        path = os.path.join(self.folder, str(number)) if number is not None else None
        while time.monotonic() < deadline:
            if path and os.path.exists(path):
                return path
            if os.path.exists(os.path.join(self.folder, ENDED)):
                return None
            time.sleep(0.05)
        return None

    def _release(self) -> None:
        """Let the kernel go on to its next cell."""
        if self.sock is not None:
            try:
                _send(self.sock, pickle.dumps({"id": 0, "op": "stop"}))
            except OSError:
                pass
            self.close()

    def _connect(self, number: int) -> None:
        self._release()
        self.gone = STOPPED
        path = self._wait(number) if self.folder else None
        if path is None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as error:
            sock.close()
            self.gone = f"the student's kernel is not answering ({error.strerror})"
            return
        sock.settimeout(self.answer_seconds)
        self.sock = sock

    def request(self, op: str, **fields):
        if self.sock is None:
            raise OracleError(self.gone)
        import torch

        self._id += 1
        env = {k: v for k, v in os.environ.items() if self._environ.get(k) != v}
        env.update({k: None for k in self._environ if k not in os.environ})
        fields = {k: _refs(v) for k, v in fields.items()}
        try:
            _send(self.sock, pickle.dumps({"id": self._id, "op": op, "env": env, **fields}))
            while True:  # an answer to a call the judge stopped waiting for is skipped
                payload = _receive(self.sock)
                if payload is None:
                    self.close()
                    self.gone = "the student's kernel closed the connection"
                    raise OracleError(self.gone)
                message = torch.load(io.BytesIO(payload), weights_only=True)
                if isinstance(message, dict) and message.get("id") == self._id:
                    break
        except TimeoutError:
            self.close()  # the kernel, once its call ends, reads that the judge left
            self.gone = f"the student's kernel gave no answer in {self.answer_seconds:g} s"
            raise OracleError(self.gone) from None
        except (OSError, pickle.PicklingError) as error:
            raise OracleError(f"the call could not reach the student's kernel: {error}") \
                from None
        except Exception as error:  # noqa: BLE001 (not data: torch.load refused it)
            if isinstance(error, OracleError):
                raise
            raise OracleError(f"the student's kernel sent what is not data: "
                              f"{str(error).splitlines()[0][:200]}") from None
        return self._unpack(message["answer"])

    def _unpack(self, packed):
        if not isinstance(packed, tuple) or not packed:
            raise OracleError(f"the student's kernel sent {type(packed).__name__}, not an answer")
        kind = packed[0]
        if kind == "value":
            return packed[1]
        if kind == "seq":
            items = [self._unpack(p) for p in packed[2]]
            return tuple(items) if packed[1] else items
        if kind == "handle":
            return Remote(self, int(packed[1]), bool(packed[2]), str(packed[3]))
        if kind == "stop":
            raise StopIteration
        if kind == "raised":
            error = _exception(*packed[1:4])
            where = packed[4] if len(packed) > 4 else None
            if isinstance(where, tuple) and len(where) == 3:  # the answer's line that raised
                error.oracle_where = (str(where[0]), int(where[1]), str(where[2]))
            raise error
        if kind == "missing":
            return _MISSING
        raise OracleError(f"the student's kernel sent an unknown answer {kind!r}")

    def bind(self, namespace: dict, imports: str, names: list, number: int) -> None:
        """Once the kernel waits at exercise `number` (the one before let go on), bind in
        `namespace` what the instructor's answer defines: its `imports` (the instructor's
        lines) run here; each of its other `names`, as the student's kernel holds it (a
        name the kernel lacks is removed)."""
        self._connect(number)
        exec(compile(imports, "<the answer's imports>", "exec"), namespace)
        for name in names:
            try:
                value = self.request("get", name=name)
            except OracleError as error:
                value = _Gone(name, str(error))
            if value is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = value

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_MISSING = object()


class _Gone:
    """A name the judge could not get from the student's kernel: any use says why."""

    def __init__(self, name: str, why: str):
        self._why = f"{name}: {why}"

    def __call__(self, *args, **kwargs):
        raise OracleError(self._why)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise OracleError(self._why)

    def __repr__(self):
        return f"<not answered: {self._why}>"


def _refs(value):
    if isinstance(value, Remote):
        return _Ref(object.__getattribute__(value, "_handle"))
    if isinstance(value, (list, tuple)):
        return type(value)(_refs(v) for v in value)
    if isinstance(value, dict):
        return {k: _refs(v) for k, v in value.items()}
    return value


# exceptions raised again as themselves: those of modules the judge has imported
def _exception(module, qualname, message) -> BaseException:
    owner = sys.modules.get(str(module))
    kind = owner
    for part in str(qualname).split("."):
        kind = getattr(kind, part, None)
    allowed = isinstance(kind, type) and (issubclass(kind, Exception) or (
        str(module), str(qualname)) == ("tools.grade_kernel", "ExerciseTimeout"))
    if allowed and kind is not OracleError:
        try:
            return kind(message)
        except Exception:  # noqa: BLE001 (one that takes other arguments)
            pass
    return OracleError(f"{module}.{qualname}: {message}" if module != "builtins"
                       else f"{qualname}: {message}")


class Remote:
    """What the student's kernel holds that is not data (a function, a sampler): each use
    is a request to the kernel."""

    def __init__(self, oracle: Oracle, handle: int, is_callable: bool, kind: str):
        object.__setattr__(self, "_oracle", oracle)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_kind", kind)

    def _ask(self, op, **fields):
        return object.__getattribute__(self, "_oracle").request(
            op, handle=object.__getattribute__(self, "_handle"), **fields)

    def __call__(self, *args, **kwargs):
        return self._ask("call", args=args, kwargs=kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __len__(self):
        return self._ask("len")

    def __getitem__(self, key):
        return self._ask("getitem", key=key)

    def __repr__(self):
        return f"<the student's {object.__getattribute__(self, '_kind')}>"
