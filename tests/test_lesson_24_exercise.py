"""Lesson 24, exercise 1 (ddp_scripts/24_store_trap/restart_exercise.py): a prefix that is
the same in every attempt is no fix: attempt 1 still publishes under attempt 0's key names, so
it either fails in the trap (a rank reads a dead process's address) or adds no key of its
own."""
from tools.launch import REPO, LaunchError, LaunchTimeout, launch

SOLUTION = 'dist.PrefixStore(f"restart-{restart}", agent_store())'


def test_a_prefix_that_does_not_change_between_attempts_is_no_fix(scripts_dir):
    source = (REPO / "ddp_scripts" / "24_store_trap/restart_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / "restart_variant.py"
    script.write_text(source.replace(SOLUTION, 'dist.PrefixStore("job", agent_store())'))
    try:
        result = launch(str(script), nproc=2, max_restarts=1, out=True, timeout=90,
                        echo=False)
    except LaunchTimeout:
        raise
    except LaunchError as error:  # the trap bit
        assert "attempt 0: rank 1 fails on purpose" in error.result.output  # restarted
        assert "Gloo connectFullMesh failed" in error.result.output
    else:  # it got through, but under the old names
        assert set(result.data["keys_attempt_1"]) == set(result.data["keys_attempt_0"])
        assert "job/0//cpu//0/0" in result.data["keys_attempt_1"]
