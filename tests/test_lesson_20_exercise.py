"""Lesson 20, exercise 1 (ddp_scripts/20_rendezvous_failures/slurm_exercise.py): an answer in which
every task connects to the store as a client, and none hosts it, waits for the store's timeout and
then fails with the client's message, within a bounded time."""
from tools.launch import REPO, free_port, launch_ranks

SCRIPT = REPO / "ddp_scripts" / "20_rendezvous_failures/slurm_exercise.py"
HOST = "is_master=rank == 0"


def test_no_rank_hosting_the_store_times_out(scripts_dir):
    source = SCRIPT.read_text()
    assert source.count(HOST) == 1
    script = scripts_dir / SCRIPT.name
    script.write_text(source.replace(HOST, "is_master=False"))
    result = launch_ranks(str(script), "--port", free_port(), "--timeout", 2, nproc=2,
                          names=("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
                          timeout=60, echo=False, expect_failure=True)
    assert "The client socket has timed out after 2000ms while trying to connect to " \
           "(127.0.0.1, " in result.output
