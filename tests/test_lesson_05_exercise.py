"""Lesson 05, exercise 3 (ddp_scripts/05_by_hand_exercise.py with by_hand_harness.py): two
typical wrong answers in one launch (step 3 as it is). Summing the gradients without dividing
by the world size trains to other weights than DDP; an all-reduce inside the hook without
async_op gives DDP's weights but makes backward wait for every message."""
from tools.launch import REPO, launch

SCRIPT = REPO / "ddp_scripts" / "05_by_hand_exercise.py"
DIVIDE = "        p.grad /= dist.get_world_size()\n    ### END SOLUTION\n\n\ndef attach_hooks"
BLOCKING = "pending.append((p, dist.all_reduce(p.grad, async_op=True)))"


def test_a_sum_is_not_ddp_and_a_blocking_hook_does_not_overlap(scripts_dir):
    source = SCRIPT.read_text()
    assert source.count(DIVIDE) == 1 and source.count(BLOCKING) == 1
    variant = source.replace(DIVIDE, "    ### END SOLUTION\n\n\ndef attach_hooks")
    variant = variant.replace(BLOCKING, "dist.all_reduce(p.grad)  # waits for the message\n"
                                        "        pending.append((p, None))")
    assert variant.count("        work.wait()\n") == 2  # finish's, then finish_buckets'
    variant = variant.replace("        work.wait()\n", "", 1)
    script = scripts_dir / SCRIPT.name
    script.write_text(variant)
    ranks = launch(str(script), nproc=2, out=True, timeout=90, echo=False).data["ranks"]
    for found in ranks:
        assert found["naive"]["max_diff"] > 1e-3  # twice the mean gradient: other weights
        assert found["overlap"]["max_diff"] < 1e-6  # right numbers...
        calls = [call for step in found["overlap"]["steps"] for call in step["all_reduces"]]
        assert len(calls) == 4 * len(found["sizes"])  # 4 steps, one call per parameter
        assert not any(is_async for _, is_async, _ in calls)  # ...but each one waited for
