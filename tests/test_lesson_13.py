"""Lesson 13's claims about DDP's gradient buckets that its launch does not show, checked
on this torch in a one-rank Gloo group inside the test process (no launch needed: DDP
builds, rebuilds and hands over its buckets the same way with one rank as with several).

What lesson 13 says, and what each test holds it to:
- by default the first step uses one bucket, and later steps use buckets rebuilt once
  in the order the gradients arrived;
- a model with a parameter its forward does not use fails at the next forward, unless
  DDP is told `find_unused_parameters=True`;
- `find_unused_parameters=True` buckets by size from the first step and never rebuilds;
  `static_graph=True` brings the single bucket and the rebuild back (one step later);
- with `bucket_cap_mb` left at its default, `None`, buckets hold 25 MiB and the first
  one only 1 MiB; a `bucket_cap_mb` you pass (even 25) caps the first bucket too.
"""
import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

MiB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    gc.collect()  # no DDP model may outlive the group (lesson 13)
    dist.destroy_process_group()


def lesson_model():
    """The shape of lesson 13's model: three Linear layers, 16 -> 32 -> 32 -> 4."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def mib_model():
    """Four Linear layers whose weights hold exactly 1 MiB each (512 x 512 float32)."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])


def buckets_per_step(model, num_steps=3, **ddp_options):
    """The buckets DDP hands to the communication hook in each of `num_steps` steps,
    each bucket as the list of its parameters' names."""
    ddp = DDP(model, **ddp_options)
    names = {id(p): name for name, p in model.named_parameters()}
    seen = []

    def hook(state, bucket):
        seen.append([names[id(p)] for p in bucket.parameters()])
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return future.then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    x = torch.randn(8, model[0].in_features)
    steps = []
    for _ in range(num_steps):
        seen.clear()
        ddp(x).sum().backward()
        steps.append(list(seen))
    del ddp
    gc.collect()
    return steps


def defined(model):
    return [name for name, _ in model.named_parameters()]


def test_by_default_one_bucket_first_then_rebuilt_once_in_gradient_order():
    model = lesson_model()
    steps = buckets_per_step(model, bucket_cap_mb=0.004)
    assert steps[0] == [defined(model)]
    assert steps[1] == [["4.bias", "4.weight", "2.bias", "2.weight"], ["0.bias", "0.weight"]]
    assert steps[2] == steps[1]


def test_find_unused_parameters_buckets_by_size_from_step_one_and_never_rebuilds():
    model = lesson_model()
    steps = buckets_per_step(model, bucket_cap_mb=0.004, find_unused_parameters=True)
    # cut in definition order at the cap, then launched in reverse
    assert steps[0] == [["2.bias", "4.weight", "4.bias"], ["0.weight", "0.bias", "2.weight"]]
    assert steps[1] == steps[0] and steps[2] == steps[0]


@pytest.mark.filterwarnings("ignore:You passed find_unused_parameters=true")
def test_static_graph_restores_the_single_bucket_and_rebuilds_a_step_later():
    for find_unused in (False, True):
        model = lesson_model()
        steps = buckets_per_step(model, num_steps=4, bucket_cap_mb=0.004, static_graph=True,
                                 find_unused_parameters=find_unused)
        assert steps[0] == steps[1] == [defined(model)], find_unused
        assert steps[2] == [["4.bias", "4.weight", "2.bias", "2.weight"],
                            ["0.bias", "0.weight"]], find_unused
        assert steps[3] == steps[2]


def test_default_cap_gives_a_1_mib_first_bucket_and_an_explicit_cap_does_not():
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 1 * MiB
    # bucket_cap_mb=None (the default): the first rebuilt bucket closes once it holds
    # 1 MiB (the last layer), the next ones at 25 MiB (all the rest here)
    steps = buckets_per_step(mib_model())
    assert steps[1] == [["3.bias", "3.weight"],
                        ["2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]]
    # bucket_cap_mb=25 passed explicitly: 25 MiB for the first bucket too, so one bucket
    model = mib_model()
    steps = buckets_per_step(model, bucket_cap_mb=25)
    assert len(steps[1]) == 1 and sorted(steps[1][0]) == sorted(defined(model))


class OneUnusedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def test_unused_parameters_fail_the_next_forward_unless_found():
    ddp = DDP(OneUnusedLayer())
    ddp(torch.randn(3, 4)).sum().backward()  # the first step passes...
    with pytest.raises(RuntimeError, match="Expected to have finished reduction in the prior"):
        ddp(torch.randn(3, 4))  # ...the next forward fails
    ddp = DDP(OneUnusedLayer(), find_unused_parameters=True)
    for _ in range(3):
        ddp(torch.randn(3, 4)).sum().backward()
    del ddp
    gc.collect()
