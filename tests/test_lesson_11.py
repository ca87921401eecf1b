"""Lesson 11's script (ddp_scripts/11_pipeline_ddp.py) needs two stages with the same number
of processes each: an odd number of processes is refused before anyone joins a group, with
a message that says what to use."""
from tools.launch import launch


def test_an_odd_number_of_processes_is_refused_clearly():
    result = launch("ddp_scripts/11_pipeline_ddp.py", nproc=3, timeout=90, echo=False,
                    expect_failure=True)
    assert "2 stages need an even number of processes, not 3" in result.output
    assert "--nproc-per-node=4" in result.output
