"""Lesson 24, on the installed torch: its statement of versions with the store
trap, and the error file torchrun can read while a rank still writes it.

Older torchrun gave the workers of each attempt keys of their own in the agent's store
(a PrefixStore named after TORCHELASTIC_RESTART_COUNT); the lesson says that prefix is
gone from torch 2.6 on. This test fails if the installed torch brings it back, so the
lesson's explanation of the trap (and its need for a fix) would have to change.
"""

import importlib.util
import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure
from torch.distributed.rendezvous import _create_c10d_store


def test_workers_use_the_agents_store_without_a_prefix_per_restart(monkeypatch):
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # as torchrun sets them
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    worker = _create_c10d_store("127.0.0.1", agent.port, rank=0, world_size=2,
                                timeout=timedelta(seconds=10))
    assert type(worker) is dist.TCPStore  # a plain client, even for rank 0: no PrefixStore
    worker.set("default_pg/0//cpu//0/0", "address of rank 0")
    assert agent.list_keys() == ["default_pg/0//cpu//0/0"]  # the name every attempt uses


# ddp_common's record and WholeErrorFile (lesson 23, "When torchrun itself fails")

@pytest.fixture(scope="module")
def ddp_common():
    """ddp_scripts/shared/ddp_common.py, loaded from its file (sys.path stays as it is)."""
    path = Path(__file__).parents[1] / "ddp_scripts" / "shared" / "ddp_common.py"
    spec = importlib.util.spec_from_file_location("ddp_common", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded(handler, message="rank 0 fails"):
    try:
        raise RuntimeError(message)
    except RuntimeError as error:
        handler.record_exception(error)


def test_whole_error_file_writes_what_torchs_handler_writes(ddp_common, tmp_path, monkeypatch):
    written = {}
    for name, handler in (("torch", ErrorHandler()), ("whole", ddp_common.WholeErrorFile())):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(folder / "error.json"))
        recorded(handler)
        assert sorted(p.name for p in folder.iterdir()) == ["error.json"]  # no .partial left
        written[name] = json.loads((folder / "error.json").read_text())
        failure = ProcessFailure(local_rank=0, pid=10, exitcode=1,
                                 error_file=str(folder / "error.json"))
        assert failure.message["message"] == "RuntimeError: rank 0 fails"  # torchrun reports
        assert "Traceback (most recent call last)" in failure.message["extraInfo"][
            "py_callstack"]
        assert failure.timestamp > 0
    for report in written.values():  # the timestamps may differ by a second
        report["message"]["extraInfo"].pop("timestamp")
    assert written["torch"] == written["whole"]


def test_whole_error_file_interrupted_leaves_no_error_file(ddp_common, tmp_path, monkeypatch):
    """Stopped in the middle of its write, torch's handler leaves an empty error file that
    torchrun's reader raises on; WholeErrorFile leaves only the file beside it."""

    def stopped(obj, f, **kwargs):
        raise KeyboardInterrupt  # stands in for the SIGTERM that ends the process here

    monkeypatch.setattr(json, "dump", stopped)
    for name, handler in (("torch", ErrorHandler()), ("whole", ddp_common.WholeErrorFile())):
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / name / "error.json"))
        (tmp_path / name).mkdir()
        with pytest.raises(KeyboardInterrupt):
            recorded(handler)
    monkeypatch.undo()
    assert (tmp_path / "torch" / "error.json").read_text() == ""
    with pytest.raises(json.JSONDecodeError):  # torchrun's agent dies on this (torch 2.13)
        ProcessFailure(local_rank=0, pid=10, exitcode=-15,
                       error_file=str(tmp_path / "torch" / "error.json"))
    assert sorted(p.name for p in (tmp_path / "whole").iterdir()) == ["error.json.partial"]
    failure = ProcessFailure(local_rank=0, pid=10, exitcode=-15,
                             error_file=str(tmp_path / "whole" / "error.json"))
    assert failure.message == "Signal 15 (SIGTERM) received by PID 10"  # a plain stop


def test_record_from_ddp_common_writes_the_error_file_and_reraises(ddp_common, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    @ddp_common.record
    def main():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        main()
    report = json.loads((tmp_path / "error.json").read_text())
    assert report["message"]["message"] == "ValueError: bad input"


def test_whole_error_file_without_torchrun_writes_nothing(ddp_common, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    recorded(ddp_common.WholeErrorFile())
    assert list(tmp_path.iterdir()) == []
