"""Lesson 30, exercise 2 (ddp_scripts/30_beyond_allreduce/zero_exercise.py): a near miss the
check must catch. All-reducing the whole gradient and then keeping only this rank's part of the
momentum gives the right weights and the right state size, but it is not ZeRO: every
rank received the whole averaged gradient, twice what the reduce-scatter delivers, and
the check rejects it by the all_reduce it calls."""
from tools.launch import REPO, launch

SOLUTION = """\
    mine = torch.empty(part, dtype=grad.dtype)
    dist.reduce_scatter_single(mine, grad)  # my part of the sum over the ranks
    mine /= world_size  # ... and of the mean
"""
ALL_REDUCED = """\
    dist.all_reduce(grad)  # the whole sum, on every rank
    mine = grad[rank * part:(rank + 1) * part] / world_size
"""


def test_all_reduce_then_slice_has_the_right_weights_but_calls_all_reduce(scripts_dir):
    source = (REPO / "ddp_scripts" / "30_beyond_allreduce/zero_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / "zero_all_reduced.py"
    script.write_text(source.replace(SOLUTION, ALL_REDUCED))
    result = launch(str(script), nproc=2, out=True, timeout=90, echo=False)
    steps = [s for found in result.data["ranks"] for s in found["steps"]]
    assert len(steps) == 2 * 4
    for s in steps:
        assert s["gap"] < 1e-12 and s["state_values"] == 24  # what the check also asks ...
        assert s["collectives"] == {"all_reduce": 1, "all_gather_single": 1}  # ... but this
