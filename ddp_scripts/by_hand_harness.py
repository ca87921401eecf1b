"""Lesson 05, exercise 3: the runs that ddp_scripts/05_by_hand_exercise.py's functions
serve. Not a script of its own: the exercise calls run_exercise(average_gradients,
attach_hooks, finish, attach_buckets, finish_buckets); rank 0 writes what every rank found
as JSON.

Four trainings from the same weights on the same batches (each rank its share): DDP, then
plain models whose gradients the learner's code averages, after backward (step 1), during
backward with a hook per parameter (step 2), and in buckets (step 3). Every dist.all_reduce
call is timed against backward. CPU and Gloo on any machine."""

import argparse
import json
import sys
import time

import torch
import torch._dynamo  # noqa: F401  before the process group: lesson 05, "A clean exit"
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, BATCH = 4, 24  # the global batch: 24 divides by 1, 2, 3 and 4 ranks
CAP = 4096  # step 3: a bucket is sent once it holds this many elements or more
calls = []  # (seconds, async_op, elements) of every dist.all_reduce the learner's code makes
waits = []  # seconds at which the learner's code waited on an asynchronous all-reduce


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def my_batches():
    """This rank's share of each global batch: the same batches in every process."""
    g = torch.Generator().manual_seed(1234)
    rank, n = dist.get_rank(), dist.get_world_size()
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 32, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        share = BATCH // n
        yield x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def train(model, after_backward=lambda: None):
    """SGD on this rank's batches; returns the final weights and per step the times
    backward started and ended (perf_counter seconds)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for x, y in my_batches():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        start = time.perf_counter()
        loss.backward()
        steps.append([start, time.perf_counter()])
        after_backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), steps


def logged(all_reduce):
    """dist.all_reduce, noting each call (and, for async_op=True, each wait on its work)."""
    def all_reduce_logged(tensor, *args, **kwargs):
        is_async = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        calls.append((time.perf_counter(), is_async, tensor.numel()))
        work = all_reduce(tensor, *args, **kwargs)
        return WaitLogged(work) if is_async else work
    return all_reduce_logged


class WaitLogged:
    def __init__(self, work):
        self.work = work

    def wait(self, *args, **kwargs):
        waits.append(time.perf_counter())
        return self.work.wait(*args, **kwargs)


def by_hand(attach, after_backward):
    """A plain model trained with the learner's code; the all-reduces it made, and the
    order in which backward finished the parameters' gradients."""
    model, pending, order = make_model(), [], []
    for k, p in enumerate(model.parameters()):  # runs before any hook the learner adds
        p.register_post_accumulate_grad_hook(lambda p, k=k: order.append(k))
    attach(model, pending)
    calls.clear(), waits.clear()
    weights, steps = train(model, lambda: after_backward(model, pending))
    return weights, timeline(steps, list(calls), list(waits)), order[:len(order) // STEPS]


def timeline(steps, made, waited):
    """Per step, in ms from backward's start: each all-reduce's start (with async_op and its
    elements), and each wait on an asynchronous one."""
    def within(k, t):
        return steps[k][0] <= t and (k + 1 == len(steps) or t < steps[k + 1][0])
    return [{"backward_ms": 1e3 * (end - start),
             "all_reduces": [[1e3 * (t - start), op, n] for t, op, n in made if within(k, t)],
             "waits": [1e3 * (t - start) for t in waited if within(k, t)]}
            for k, (start, end) in enumerate(steps)]


def experiment(average_gradients, attach_hooks, finish, attach_buckets, finish_buckets):
    reference, _ = train(DDP(make_model()))  # DDP's own all-reduces are not logged
    dist.all_reduce = logged(dist.all_reduce)
    found = {"sizes": [p.numel() for p in make_model().parameters()], "cap": CAP}
    runs = {"naive": (lambda model, pending: None, lambda model, _: average_gradients(model)),
            "overlap": (attach_hooks, lambda _, pending: finish(pending)),
            "buckets": (lambda model, pending: attach_buckets(model, pending, CAP),
                        lambda _, pending: finish_buckets(pending))}
    for name, (attach, after_backward) in runs.items():
        weights, steps, order = by_hand(attach, after_backward)
        found[name] = {"max_diff": (weights - reference).abs().max().item(),
                       "steps": steps, "order": order}
    return found


@record
def run_exercise(*functions):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout)  # lesson 01
    found = experiment(*functions)
    print(f"rank {rank}: max |by hand - DDP|: " + ", ".join(
        f"{name} {found[name]['max_diff']:.1e}" for name in ("naive", "overlap", "buckets")))
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world_size, "ranks": everyone}, f)
    teardown()
