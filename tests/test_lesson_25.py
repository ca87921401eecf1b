"""Lesson 25 (debugging hangs): the bugs at 3 ranks, which the lesson does not run, each
ended by its collective timeout with its dumps written. The lesson itself, with its
exercise's proof, runs in test_notebooks.py at 2 ranks."""

import os
import pickle

import pytest

from tools.launch import launch


def traces(folder):
    return {int(f.name.split("_")[1]): pickle.loads(f.read_bytes())
            for f in sorted((folder / "fr").glob("rank_*"))}


@pytest.mark.parametrize("bug", ["rank0_eval", "stalled_loader"])
def test_each_bug_times_out_at_three_ranks_and_leaves_its_dumps(bug, tmp_path):
    run = launch("ddp_scripts/25_debugging/hangs.py", "--bug", bug, "--timeout", 2, "--dumps",
                 tmp_path,
                 nproc=3, out=tmp_path / "out.json", expect_failure=True, timeout=90,
                 echo=False, env={"TORCH_FR_BUFFER_SIZE": "2000"})
    caught = run.data["caught"]  # rank 0's error: its own timeout, or the others' failure
    assert not run.timed_out and ("Timed out" in caught or "Connection closed" in caught)
    found = traces(tmp_path)
    if bug == "rank0_eval":  # rank 0's extra broadcast against the others' barrier
        assert sorted(found) == [0, 1, 2]
        assert found[0]["entries"][-1]["profiling_name"] == "gloo:broadcast"
        assert {found[r]["entries"][-1]["profiling_name"] for r in (1, 2)} == {"gloo:barrier"}
    else:  # the stalled rank (the last) writes no dump; its stack shows where it is
        assert 2 not in found
        stacks = (tmp_path / "stacks.txt").read_text()
        assert "Numbers.__getitem__" in stacks.split("=== rank 2")[1]


def test_the_flight_recorder_records_without_being_asked(tmp_path):
    """The lesson's deep dive: on torch 2.13 with Gloo the recorder is on by default."""
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ
    launch("ddp_scripts/25_debugging/hangs.py", "--timeout", 2, "--dumps", tmp_path, nproc=2,
           expect_failure=True, timeout=90, echo=False)
    found = traces(tmp_path)
    assert [e["profiling_name"] for e in found[0]["entries"]][-1] == "gloo:reduce"
