"""Lesson 40 (capstone): its claims at the world sizes the lesson does not run, the fix it
states for the evaluation trap, and an answer its first check must reject. The lesson
itself, with its exercises' proofs, runs in test_notebooks.py at 2 ranks."""

import pytest

from tools.launch import REPO, cpu_unless_enough_gpus, launch

STEPS = 40  # of the lesson's 200: a shorter schedule, the same for both runs
TOLERANCE = 0.03  # the lesson's, for the loss curves (bf16); 0.004 to 0.010 at 200 steps


@pytest.fixture(scope="module")
def one_process():
    run = launch("ddp_scripts/40_capstone_gpt/gpt_plain.py", "--steps", STEPS, nproc=None, out=True,
                 timeout=120, echo=False)
    return run.data["ranks"][0]["losses"]


# 24 windows a step: 4 x 2 micro-batches x 3 ranks, 3 x 2 x 4 ranks
@pytest.mark.parametrize("world_size, micro", [(3, 4), (4, 3)])
def test_ddp_follows_the_one_process_curve(world_size, micro, one_process):
    run = launch("ddp_scripts/40_capstone_gpt/gpt_ddp.py", "--steps", STEPS, "--micro", micro,
                 nproc=world_size, out=True, timeout=120, echo=False,
                 env=cpu_unless_enough_gpus(world_size))
    ranks = run.data["ranks"]
    gap = max(abs(a - b) for a, b in zip(one_process, ranks[0]["losses"]))
    assert len(ranks) == world_size and len(ranks[0]["losses"]) == STEPS
    assert len({r["weights_sha256"] for r in ranks}) == 1, "the ranks drifted apart"
    assert gap < TOLERANCE, f"{world_size} ranks: {gap:.4f} from one process's curve"


def test_the_stated_fix_evaluates_alone_without_a_hang():
    run = launch("ddp_scripts/40_capstone_gpt/eval_trap.py", "--timeout", 4, "--fix", nproc=2,
                 timeout=60,
                 echo=False)
    assert "buffers: 1, the ranks went on together" in run.output


def test_a_reduction_that_handles_the_tied_weight_twice_is_caught(scripts_dir):
    """Exercise 1's check runs on the tied GPT: walking the modules reaches the shared
    tensor twice (as the embedding's weight and the output layer's), so it is all-reduced
    and divided twice, and its gradient is off."""
    source = (REPO / "ddp_scripts" / "40_capstone_gpt/token_exercise.py").read_text()
    twice = source.replace(
        "for p in model.parameters():",
        "for p in (q for m in model.modules() for q in m.parameters(recurse=False)):")
    assert twice != source
    script = scripts_dir / "tied_twice.py"  # beside the capstone's modules
    script.write_text(twice)
    run = launch(str(script), nproc=2, out=True, timeout=60, echo=False)
    for r in run.data["ranks"]:
        assert r["gaps"]["tokens.weight"] > 0.1, r["gaps"]["tokens.weight"]
        others = [g for name, g in r["gaps"].items() if name != "tokens.weight"]
        assert max(others) < 1e-4  # only the shared tensor is off
