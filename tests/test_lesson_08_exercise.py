"""Lesson 08, exercise 4 (ddp_scripts/08_restart_exercise.py): a prefix that is the same in
every attempt is no fix: attempt 1 still reads attempt 0's addresses and fails."""
from tools.launch import REPO, launch

SOLUTION = 'dist.PrefixStore(f"restart-{restart}", agent_store(timeout))'


def test_a_prefix_that_does_not_change_between_attempts_walks_into_the_trap(scripts_dir):
    source = (REPO / "ddp_scripts" / "08_restart_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / "08_restart_variant.py"
    script.write_text(source.replace(SOLUTION, 'dist.PrefixStore("job", agent_store(timeout))'))
    result = launch(str(script), nproc=2, max_restarts=1, timeout=90, echo=False,
                    expect_failure=True)
    assert "Gloo connectFullMesh failed" in result.output
    assert "attempt 0: rank 1 fails on purpose" in result.output  # it got to the restart
