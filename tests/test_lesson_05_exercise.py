"""Lesson 05, exercise 2 (ddp_scripts/05_real_training/accumulate_exercise.py): two near misses of
gradient accumulation that the exercise's check must catch. Dividing each micro-batch's
loss by the number of micro-batches is right only when they are equal (8, 8, 8, 5 are
not): the weights drift from the one-batch reference. A forward outside `no_sync`, with
only the backward inside, still synchronizes: the gradient is right, the all-reduces are
four per step instead of one. Averaging the gradients by hand, one tensor at a time, with
no DDP sync: the right gradient, but an all-reduce per parameter, which the count sees."""
from tools.launch import REPO, launch

SOLUTION = """\
    total = sum(len(y) for _, y in micro_batches)
    *first, last = micro_batches
    with model.no_sync():  # forward and backward: gradients accumulate, no all-reduce
        for x, y in first:
            (F.cross_entropy(model(x), y) * len(y) / total).backward()
    x, y = last
    (F.cross_entropy(model(x), y) * len(y) / total).backward()  # all-reduces the sum
"""
DIVIDED_BY_COUNT = """\
    *first, last = micro_batches
    with model.no_sync():
        for x, y in first:
            (F.cross_entropy(model(x), y) / len(micro_batches)).backward()
    x, y = last
    (F.cross_entropy(model(x), y) / len(micro_batches)).backward()
"""
FORWARD_OUTSIDE = """\
    total = sum(len(y) for _, y in micro_batches)
    *first, last = micro_batches
    for x, y in first:
        loss = F.cross_entropy(model(x), y) * len(y) / total  # forward outside no_sync
        with model.no_sync():
            loss.backward()
    x, y = last
    (F.cross_entropy(model(x), y) * len(y) / total).backward()
"""
BY_HAND = """\
    import torch.distributed as dist
    total = sum(len(y) for _, y in micro_batches)
    with model.no_sync():  # no DDP all-reduce at all: the gradients are averaged by hand
        for x, y in micro_batches:
            (F.cross_entropy(model(x), y) * len(y) / total).backward()
    for p in model.parameters():  # one all-reduce per tensor
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
"""


def run_variant(scripts_dir, name, body):
    source = (REPO / "ddp_scripts" / "05_real_training/accumulate_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / f"accumulate_{name}.py"
    script.write_text(source.replace(SOLUTION, body))
    result = launch(str(script), nproc=2, out=True, timeout=90, echo=False)
    return [s for found in result.data["ranks"] for s in found["steps"]], \
        result.data["ranks"][0]["reference_allreduces"]


def test_dividing_by_the_number_of_micro_batches_misses_the_reference(scripts_dir):
    steps, reference_allreduces = run_variant(scripts_dir, "divided_by_count", DIVIDED_BY_COUNT)
    assert all(s["allreduces"] == reference_allreduces == 1 for s in steps)
    assert all(s["gap"] > 1e-4 for s in steps), steps  # the check's bound is 1e-10


def test_averaging_by_hand_one_tensor_at_a_time_is_counted(scripts_dir):
    steps, reference_allreduces = run_variant(scripts_dir, "by_hand", BY_HAND)
    assert all(s["gap"] < 1e-10 for s in steps)  # the right gradient ...
    assert all(s["allreduces"] == 0 for s in steps)  # ... none through DDP's hook ...
    assert all(s["by_hand"] > reference_allreduces for s in steps), steps  # ... but counted


def test_a_forward_outside_no_sync_still_synchronizes(scripts_dir):
    steps, reference_allreduces = run_variant(scripts_dir, "forward_outside", FORWARD_OUTSIDE)
    assert all(s["gap"] < 1e-10 for s in steps)  # the right gradient ...
    assert all(s["allreduces"] == 4 * reference_allreduces for s in steps)  # ... 4 all-reduces
