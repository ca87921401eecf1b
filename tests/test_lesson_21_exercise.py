"""Lesson 21, exercise 4 (ddp_scripts/21_skewed_speeds/uneven_exercise.py): two wrong
answers. Passing the model inside the DDP wrapper to Join fails at once (it is not a
joinable); Join with divide_by_initial_world_size=False finishes, with the same weights on
every rank, but the reference that the check compares with (the lesson's default division)
tells it apart."""
import pytest

from tools.launch import REPO, launch

SOLUTION = "    with Join([ddp]):\n"


@pytest.fixture
def variant(scripts_dir):
    source = (REPO / "ddp_scripts" / "21_skewed_speeds/uneven_exercise.py").read_text()
    assert source.count(SOLUTION) == 1

    def write(replacement):
        script = scripts_dir / "uneven_variant.py"
        script.write_text(source.replace(SOLUTION, replacement))
        return script

    return write


def test_join_given_the_inner_model_fails_at_once(variant):
    script = variant("    with Join([ddp.module]):\n")
    result = launch(str(script), nproc=2, timeout=60, echo=False, expect_failure=True)
    assert "AttributeError: 'Sequential' object has no attribute 'join_hook'" in result.output
    assert "in train" in result.output  # @record: the rank's traceback


def test_join_without_dividing_by_the_initial_world_size_misses_the_reference(variant):
    script = variant("    with Join([ddp], divide_by_initial_world_size=False):\n")
    result = launch(str(script), nproc=2, out=True, timeout=60, echo=False)
    counts, ranks = result.data["counts"], result.data["ranks"]
    assert counts == [4, 2]
    assert [r["optimizer_steps"] for r in ranks] == [4, 2]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # Join's broadcast at the end
    assert not any(r["matches_reference"] for r in ranks)  # the extra steps: / 1, not / 2
