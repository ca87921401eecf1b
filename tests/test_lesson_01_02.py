"""Lessons 01 and 02: what torchrun's failure report holds, with and without @record,
and how it picks the Root Cause (torch 2.13); lesson 01's exercise 2 on its typical wrong
answer."""
import json
import sys

import nbformat
import pytest
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from torch.distributed.elastic.multiprocessing.errors import (
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
)

from tools.course import NOTEBOOKS, REPO
from tools.launch import launch

NO_TRACEBACK = "traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic"


def split_report(output):
    """(the Root Cause entry, the Failures entries) of torchrun's report."""
    before, root = output.split("Root Cause (first observed failure):")
    return root, before.split("Failures:")[-1]


def test_without_record_the_report_has_no_traceback():
    result = launch("tests/fixtures/raises.py", nproc=2, timeout=120, echo=False,
                    expect_failure=True)
    root, others = split_report(result.output)
    assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : 1 " in root
    assert "error_file: <N/A>" in root and NO_TRACEBACK in root
    assert "RuntimeError" not in root
    assert "[default1]:RuntimeError: rank 1 raises" in result.output  # only in its own output
    assert "rank      : 0 (local_rank: 0)" in others  # stopped by torchrun
    assert "Signal 15 (SIGTERM) received" in others


def test_with_record_a_single_failure_carries_its_traceback():
    result = launch("tests/fixtures/raises.py", "--record", nproc=1, timeout=120,
                    echo=False, expect_failure=True)
    root, others = split_report(result.output)
    assert "rank      : 0 (local_rank: 0)" in root
    assert "Traceback (most recent call last)" in root and "RuntimeError: rank 0 raises" in root
    assert "error.json" in root and NO_TRACEBACK not in root
    assert others.strip().startswith("<NO_OTHER_FAILURES>")  # one process, one failure


def exercise_2_check() -> str:
    nb = nbformat.read(NOTEBOOKS / "01_how_the_course_works.ipynb", as_version=4)
    return next(c.source for c in nb.cells if "check" in c.metadata.get("tags", [])
                and "01_how_the_course_works/failure_exercise.py" in c.source)


def test_record_lets_system_exit_through_and_exercise_2_says_so(scripts_dir):
    """Exercise 2's typical wrong answer keeps @record but stops the rank with sys.exit
    (as argparse does on a bad option): @record does not record SystemExit, so the report
    has no traceback, and the exercise's check says what it expected and what came."""
    source = (REPO / "ddp_scripts" / "01_how_the_course_works/failure_exercise.py").read_text()
    raising = '        raise ValueError(f"rank {rank}: my shard of the data is empty")\n'
    assert source.count(raising) == 1 and source.count("@record") == 1
    script = scripts_dir / "failure_exercise.py"
    script.write_text(source.replace(raising, raising.replace("raise ValueError", "sys.exit")))
    result = launch(str(script), "--empty-rank", 1, nproc=2, timeout=120, echo=False,
                    expect_failure=True)
    root, others = split_report(result.output)
    assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : 1 " in root
    assert "error_file: <N/A>" in root and NO_TRACEBACK in root
    assert "<NO_OTHER_FAILURES>" not in others  # the other rank is listed (stopped)
    namespace = {"launch": lambda *args, **kwargs: result, "world_size": 2,
                 "exercise_timeout": 90, "cpu_unless_enough_gpus": lambda n: {}}
    with pytest.raises(AssertionError, match=r"(?s)expected the Root Cause to hold rank 1's "
                       r"traceback ending in .*error_file: <N/A>.*lets sys.exit through"):
        exec(exercise_2_check(), namespace)


def test_record_writes_whole_seconds_and_ties_go_to_the_first_listed(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise RuntimeError("boom")
    except RuntimeError as error:
        ErrorHandler().record_exception(error)  # what @record does
    stamp = json.loads(error_file.read_text())["message"]["extraInfo"]["timestamp"]
    assert stamp.isdigit()  # whole seconds since the epoch
    recorded = ProcessFailure(local_rank=1, pid=11, exitcode=1, error_file=str(error_file))
    stopped = ProcessFailure(local_rank=0, pid=10, exitcode=-15,
                             error_file=str(tmp_path / "none.json"))
    assert recorded.timestamp == int(stamp)  # the rank's time, read back from the file
    stopped.timestamp = recorded.timestamp  # the same second
    assert ChildFailedError("job", {1: recorded, 0: stopped}).get_first_failure()[0] == 1
    assert ChildFailedError("job", {0: stopped, 1: recorded}).get_first_failure()[0] == 0
    stopped.timestamp = recorded.timestamp - 1  # a second earlier wins in any order
    assert ChildFailedError("job", {1: recorded, 0: stopped}).get_first_failure()[0] == 0


def test_ranks_found_dead_at_one_check_are_listed_lowest_first(tmp_path):
    """torchrun's check lists failed ranks by local rank: local rank 2 dies first, yet
    the Root Cause is local rank 0 when one check finds all three dead."""
    delays = {0: 1.0, 1: 0.6, 2: 0.2}  # seconds before each exits with status 1
    context = start_processes(
        name="trainer", entrypoint=sys.executable,
        args={r: ("-c", f"import sys, time; time.sleep({d}); sys.exit(1)")
              for r, d in delays.items()},
        envs={r: {} for r in delays}, logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)))
    try:
        for handler in context.subprocess_handlers.values():
            handler.proc.wait(timeout=60)  # all dead before torchrun's check looks
        result = context.wait(0)  # one check, as torchrun's agent makes every 0.1 s
    finally:
        context.close()
    assert list(result.failures) == [0, 1, 2]
    assert ChildFailedError("trainer", result.failures).get_first_failure()[0] == 0
