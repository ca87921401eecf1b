"""Lesson 13, exercises 3 to 5 (DDP by hand: ddp_scripts/13_inside_ddp/by_hand_after.py,
_hooks.py and _buckets.py, with by_hand_harness.py): three typical wrong answers in one
launch, and the messages the checks show for them. Summing the gradients without dividing by
the world size trains to other weights than DDP; an all-reduce started but never waited for
gets no wait(); a bucket rule that takes every parameter, frozen ones included, cannot
register its hook on a parameter that needs no gradient."""
from tools.launch import REPO, launch

SCRIPTS = REPO / "ddp_scripts"
DIVIDE = "        p.grad /= dist.get_world_size()\n    ### END SOLUTION"
WAIT = "            work.wait()\n"
TRAINABLE = "for p in [p for p in model.parameters() if p.requires_grad]:  # frozen: left out"
ALL_THREE = '''"""Three wrong answers, one launch (--out)."""
import importlib.util
import sys
from pathlib import Path

from by_hand_harness import run_exercise


def load(name):
    spec = importlib.util.spec_from_file_location(name, Path(sys.path[0]) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_exercise(after=load("wrong_after").average_gradients,
             hooks=load("wrong_hooks").attach_hooks,
             buckets=load("wrong_buckets").attach_buckets)
'''


def wrong(name, old, new, scripts_dir):
    source = (SCRIPTS / "13_inside_ddp" / f"by_hand_{name}.py").read_text()
    assert source.count(old) == 1, (name, old)
    (scripts_dir / f"wrong_{name}.py").write_text(source.replace(old, new))


def test_a_sum_a_missing_wait_and_a_hook_on_a_frozen_parameter_are_named(scripts_dir):
    wrong("after", DIVIDE, "    ### END SOLUTION", scripts_dir)
    wrong("hooks", WAIT, "", scripts_dir)
    wrong("buckets", TRAINABLE, "for p in list(model.parameters()):", scripts_dir)
    script = scripts_dir / "all_three.py"
    script.write_text(ALL_THREE)
    ranks = launch(str(script), nproc=2, out=True, timeout=120, echo=False).data["ranks"]
    for rank, found in enumerate(ranks):
        after, hooks, buckets = (found[step]["problems"] for step in ("after", "hooks", "buckets"))
        for model in ("lesson", "tricky"):  # twice the mean gradient: other weights
            assert any(p.startswith(f"rank {rank}, {model} model: after 4 steps the weights "
                                    f"differ from DDP's by") and "(expected < 1e-06)" in p
                       for p in after), after
        assert (f"rank {rank}, lesson model, step 1: 0 work.wait() for 6 asynchronous "
                f"all-reduces (expected one each, before the optimizer step)") in hooks, hooks
        assert buckets == [f"rank {rank}, tricky model: your code raised RuntimeError: cannot "
                           f"register a hook on a tensor that doesn't require gradient"], buckets
