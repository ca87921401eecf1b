"""Lesson 10, exercise 3 (ddp_scripts/10_collectives/ring_exercise.py): the mistake the lesson warns
about, every rank calling a blocking send before its receive, hangs on Gloo even for one
element, and the script's --timeout turns the hang into Gloo's error, fast."""
from tools.launch import REPO, launch

SOLUTION = """\
        incoming = torch.empty_like(mine)
        exchange(chunks[(rank - step) % n], incoming, rank, n)
"""
BLOCKING = """\
        incoming = torch.empty_like(mine)
        dist.send(chunks[(rank - step) % n], (rank + 1) % n)  # every rank sends first
        dist.recv(incoming, (rank - 1) % n)
"""


def test_blocking_send_before_recv_hangs_until_gloo_timeout(scripts_dir):
    source = (REPO / "ddp_scripts" / "10_collectives/ring_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / "ring_blocking.py"
    script.write_text(source.replace(SOLUTION, BLOCKING))
    # A hang past the launch's 60 s would raise LaunchTimeout; Gloo's 3 s end it first.
    result = launch(str(script), "--timeout", "3", "--sizes", "1", nproc=2, timeout=60,
                    echo=False, expect_failure=True)
    assert "Timed out waiting 3000ms for send operation to complete" in result.output
    assert "in reduce_scatter" in result.output  # @record: the rank's traceback
