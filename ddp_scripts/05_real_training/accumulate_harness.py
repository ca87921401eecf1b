"""Lesson 05, exercise 2: the DDP run whose `train_step` accumulate_exercise.py writes. Not
a script of its own: the exercise calls run_exercise(train_step), and rank 0 writes what
every rank found as JSON.

Each optimizer step takes micro-batches of 8, 8, 8 and 5 samples on every rank (29 in
all); a reference model takes the same 29 samples as one batch. Both start from the same
weights, in float64; a communication hook counts DDP's all-reduces, and while train_step
runs, every call of torch.distributed.all_reduce is counted too: DDP's hook makes them,
and so does an all-reduce by hand. CPU and Gloo."""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

SIZES, STEPS = (8, 8, 8, 5), 3  # one micro-batch shorter, as the last one of an epoch


def counted_model():
    """A small MLP in DDP, in float64, its SGD, and a counter of the all-reduces it makes."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).double())
    counter = {"allreduces": 0}

    def hook(state, bucket):
        state["allreduces"] += 1
        return default_hooks.allreduce_hook(None, bucket)
    model.register_comm_hook(counter, hook)
    return model, counter, torch.optim.SGD(model.parameters(), lr=0.5)


def batches(rank, step):
    """This rank's samples for one optimizer step, as micro-batches."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(sum(SIZES), 16, generator=g, dtype=torch.float64)
    y = torch.randint(3, (sum(SIZES),), generator=g)
    return list(zip(x.split(SIZES), y.split(SIZES)))


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def counting_all_reduces(train_step, model, optimizer, micro):
    """train_step, with torch.distributed.all_reduce counting its calls: DDP's hook calls it
    once a bucket, and an all-reduce by hand (dist.all_reduce) once a tensor."""
    original, calls = dist.all_reduce, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)
    dist.all_reduce = counted
    try:
        train_step(model, optimizer, micro)
    finally:
        dist.all_reduce = original
    return calls[0]


@record
def run_exercise(train_step):
    parser = arguments(sys.modules["__main__"].__doc__)  # --device, --out (lesson 02)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    args = parser.parse_args()
    rank = setup("cpu", timeout_s=args.timeout, ddp=True).rank  # CPU, whatever --device says
    model, counter, optimizer = counted_model()
    reference, reference_counter, reference_optimizer = counted_model()
    found = {"steps": []}
    for step in range(STEPS):
        micro = batches(rank, step)
        before = counter["allreduces"]
        calls = counting_all_reduces(train_step, model, optimizer, micro)
        ddp = counter["allreduces"] - before  # the calls through DDP's hook
        reference_optimizer.zero_grad()
        x, y = torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro])
        F.cross_entropy(reference(x), y).backward()  # all 29 samples at once
        reference_optimizer.step()
        found["steps"].append({
            "allreduces": ddp, "by_hand": calls - ddp,
            "gap": (weights(model) - weights(reference)).abs().max().item()})
    found["reference_allreduces"] = reference_counter["allreduces"] // STEPS
    del model, reference, optimizer, reference_optimizer
    print(f"rank {rank}: all-reduces per step through DDP "
          f"{[s['allreduces'] for s in found['steps']]}, by hand "
          f"{[s['by_hand'] for s in found['steps']]}, "
          f"largest weight difference {max(s['gap'] for s in found['steps']):.1e}", flush=True)
    report(args.out, found, sizes=SIZES)
    teardown()
