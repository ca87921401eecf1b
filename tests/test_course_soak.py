"""`make soak` (tools/course_soak.py): it reads each lesson's status, seconds and failed cell
from the course's own output, and its busy loops are stopped, whatever happens."""
import os
import time

from tools import course_soak

OUTPUT = """\
[1/3] 00_ddp_in_ten_minutes.ipynb: running
[1/3] 00_ddp_in_ten_minutes.ipynb: ok in 25.1 s
[2/3] 03_ddp_training.ipynb: running
03_ddp_training.ipynb failed:
---------------------------------------------------------------------------
Exception encountered at "In [14]":
AssertionError                            Traceback (most recent call last)
AssertionError: assert 1.1 > 2.3
[2/3] 03_ddp_training.ipynb: FAILED in 40.2 s
[3/3] 32_clusters.ipynb: running
32_clusters.ipynb skipped: needs root
[3/3] 32_clusters.ipynb: skipped in 0.1 s
"""


def test_each_lesson_is_read_with_the_cell_that_failed():
    found = course_soak.course_results(OUTPUT)
    assert [(r["lesson"], r["status"], r["seconds"]) for r in found] == [
        ("00_ddp_in_ten_minutes.ipynb", "ok", 25.1), ("03_ddp_training.ipynb", "FAILED", 40.2),
        ("32_clusters.ipynb", "skipped", 0.1)]
    assert found[1]["cell"] == "In [14]"
    assert found[1]["error"] == "AssertionError: assert 1.1 > 2.3"


def test_the_busy_loops_keep_a_core_busy_and_stop():
    busy = course_soak.start_busy(1)
    try:
        time.sleep(1.0)
        with open(f"/proc/{busy[0].pid}/stat") as f:
            ticks = sum(int(x) for x in f.read().split(")")[1].split()[11:13])
        assert ticks > 0.3 * os.sysconf("SC_CLK_TCK"), f"{ticks} CPU ticks in 1 s"
    finally:
        course_soak.stop(busy)
    assert busy[0].poll() is not None
