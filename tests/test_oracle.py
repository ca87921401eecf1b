"""tools/oracle.py: the judge calls a student's functions in the student's process, and
reads back data only."""

import io
import os
import pickle
import socket
import subprocess
import sys
import threading

import pytest
import torch

from tools.course import REPO
from tools.grade import answer_names
from tools.oracle import ENDED, Oracle, OracleError, _receive, _send

STUDENT = """
import os, sys, time
sys.path.insert(0, {repo!r})
from torch.utils.data import DataLoader, TensorDataset
import torch
from tools.oracle import serve

scale = 3
def times(x):
    return scale * x
def picky(x):
    if x < 0:
        raise ValueError(f"no negatives: {{x}}")
    return [x, {{"half": x / 2}}, torch.arange(x)]
def refuse():
    import pickle
    raise pickle.UnpicklingError("refused")
def env(name):
    return os.environ.get(name)
def loader(n):
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=2), "plain"
def fitted():
    import numpy as np
    return np.float64(0.5) * 2, np.arange(3)
def sleepy():
    time.sleep(6)
print(serve({folder!r}, 1, globals(), 60), "answered", flush=True)
print(serve({folder!r}, 2, globals(), 60), "answered", flush=True)
"""


@pytest.fixture
def student(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", STUDENT.format(repo=str(REPO),
                                                                      folder=str(tmp_path))],
                               stdout=subprocess.PIPE, text=True)
    yield str(tmp_path), process
    process.kill()
    process.wait()


def test_the_judge_gets_data_and_calls_the_rest(student):
    folder, process = student
    oracle = Oracle(folder, first=1, wait_seconds=60, answer_seconds=2)
    ns = {}
    imports, names = answer_names("import math\nscale = 2\ndef times(x): ...\n"
                                  "def picky(x): ...\ndef refuse(): ...\ndef env(n): ...\n"
                                  "def loader(n): ...\ndef fitted(): ...\ndef sleepy(): ...\n"
                                  "def absent(): ...")
    assert imports == "import math" and "math" not in names and "times" in names
    oracle.bind(ns, imports, names, 1)
    assert ns["math"].pi > 3  # the instructor's import, run here
    assert ns["scale"] == 3 and "absent" not in ns  # the student's value; what they lack
    assert ns["times"](5) == 15
    number, half, tensor = ns["picky"](4)
    assert (number, half) == (4, {"half": 2.0}) and torch.equal(tensor, torch.arange(4))
    with pytest.raises(ValueError, match="no negatives: -1"):
        ns["picky"](-1)
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        ns["refuse"]()
    os.environ["ORACLE_TEST"] = "set by the check"
    try:
        assert ns["env"]("ORACLE_TEST") == "set by the check"  # the check's environment
    finally:
        del os.environ["ORACLE_TEST"]
    assert ns["env"]("ORACLE_TEST") is None
    assert ns["fitted"]() == (1.0, [0, 1, 2])  # numpy's numbers, as Python's
    remote, word = ns["loader"](5)  # not data: used through the kernel
    assert word == "plain" and len(remote) == 3
    assert [b[0].tolist() for b in remote] == [[0, 1], [2, 3], [4]]
    with pytest.raises(OracleError, match="no answer in 2 s"):
        ns["sleepy"]()
    with pytest.raises(OracleError, match="no answer in 2 s"):
        ns["times"](1)  # the kernel is still busy: it is not waited for again
    # the next exercise: the kernel went on (its first wait ended), and answers again
    oracle.bind(ns, "", ["times"], 2)
    assert process.stdout.readline().split()[1] == "answered"
    assert ns["times"](2) == 6
    oracle.close()  # the judge is done: the kernel goes on
    assert process.stdout.readline() == "2 answered\n"  # the get of `times`, and a call
    assert process.wait(timeout=10) == 0


def test_a_kernel_that_stopped_or_forges_answers_fails_the_check(tmp_path):
    (tmp_path / ENDED).touch()  # the lesson stopped before the exercise
    ns = {}
    Oracle(str(tmp_path), first=1).bind(ns, "", ["times"], 1)
    with pytest.raises(OracleError, match="stopped before it could answer"):
        ns["times"](1)
    # a kernel that answers with code, not data: refused, never run
    folder = tmp_path / "forger"
    folder.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / "1"))
    listener.listen(1)

    def forge():
        conn, _ = listener.accept()
        with conn:
            while (request := _receive(conn)) is not None:
                number = pickle.loads(request)["id"]
                buffer = io.BytesIO()
                torch.save({"id": number, "answer": ("value", os.system)}, buffer)
                _send(conn, buffer.getvalue())

    threading.Thread(target=forge, daemon=True).start()
    oracle = Oracle(str(folder), first=1, answer_seconds=5)
    oracle._connect(1)
    with pytest.raises(OracleError, match="not data"):
        oracle.request("get", name="times")
    oracle.close()
    listener.close()
