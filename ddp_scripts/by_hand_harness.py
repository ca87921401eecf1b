"""Lesson 05, exercises 3 to 5: DDP by hand. Not a script of its own: 05_by_hand_after.py,
05_by_hand_hooks.py and 05_by_hand_buckets.py each call run_exercise with the learner's
function; rank 0 writes what every rank found, and what is wrong, as JSON.

Two models, each trained twice from the same weights on the same batches (each rank its
share): in DDP, and plain, with the learner's code averaging the gradients. The lesson's
model is three Linear layers; the other has what models people train have: a frozen layer,
a frozen bias, one weight used by two layers (tied), a branch no rank uses and one only the
even ranks use (its DDP has find_unused_parameters=True). Every dist.all_reduce the learner's
code makes on the lesson's model is timed against backward. CPU and Gloo on any machine."""

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, BATCH = 4, 24  # the global batch: 24 divides by 1, 2, 3 and 4 ranks
CAP = 4096  # exercise 5: a bucket closes once it holds this many elements or more
TOLERANCE = 1e-6  # measured: 1.5e-8 at most at 2, 3 and 4 ranks (sums in another order)
calls = []  # (seconds, async_op, elements) of every dist.all_reduce the learner's code makes
waits = []  # seconds at which the learner's code waited on an asynchronous all-reduce


def lesson_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


class Tricky(nn.Module):
    """Frozen, tied and unused parameters, as in the models people fine-tune."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.frozen = nn.Linear(32, 32).requires_grad_(False)  # a frozen layer
        self.tied, self.again = nn.Linear(32, 32), nn.Linear(32, 32)
        self.again.weight = self.tied.weight  # one Parameter, used by two layers
        self.never = nn.Linear(32, 4)  # no rank uses it: its gradient stays None
        self.even = nn.Linear(32, 4)  # used on even ranks only: zero on the others
        self.head = nn.Linear(32, 4)
        self.head.bias.requires_grad_(False)  # a frozen bias

    def forward(self, x):
        h = F.relu(self.again(F.relu(self.tied(F.relu(self.frozen(x))))))
        return self.head(h) + (self.even(h) if dist.get_rank() % 2 == 0 else 0)
def my_batches():
    """This rank's share of each global batch: the same batches in every process."""
    g = torch.Generator().manual_seed(1234)
    rank, share = dist.get_rank(), BATCH // dist.get_world_size()
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 32, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        yield x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def train(model, after_backward=lambda: None):
    """SGD with momentum on this rank's batches; per step, when backward started and ended."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for x, y in my_batches():
        optimizer.zero_grad()  # the gradients are None again
        loss = F.cross_entropy(model(x), y)
        start = time.perf_counter()
        loss.backward()
        steps.append([start, time.perf_counter()])
        after_backward()
        optimizer.step()
    return steps


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
def by_hand(step, function, make):
    """A plain model trained with the learner's function. after: called after each backward;
    hooks, buckets: called once, and returns what to call after each backward."""
    model = make()
    if step == "after":
        finish = lambda: function(model)  # noqa: E731
    else:
        finish = function(model, CAP) if step == "buckets" else function(model)
    calls.clear(), waits.clear()
    return model, train(model, finish)


def timeline(steps):
    """Per step, in ms from backward's start: each all-reduce's start (with async_op and its
    elements), and each wait on an asynchronous one."""
    def within(k, t):
        return steps[k][0] <= t and (k + 1 == len(steps) or t < steps[k + 1][0])
    return [{"backward_ms": 1e3 * (end - start),
             "all_reduces": [[1e3 * (t - start), op, n] for t, op, n in calls if within(k, t)],
             "waits": [1e3 * (t - start) for t in waits if within(k, t)]}
            for k, (start, end) in enumerate(steps)]


def differences(mine, ddp):
    """The largest weight difference from DDP's model and where; the gradients that are None
    in one model and not in the other."""
    worst, where, nones = 0.0, None, []
    for (name, p), q in zip(mine.named_parameters(), ddp.parameters()):
        diff = (p.detach() - q.detach()).abs().max().item()
        if not diff <= worst:  # NaN counts as the worst
            worst, where = diff, name
        if (p.grad is None) != (q.grad is None):
            nones.append(f"{name} ({'None' if p.grad is None else 'a tensor'}, DDP's "
                         f"{'None' if q.grad is None else 'a tensor'})")
    return {"max_diff": worst, "where": where, "grad_none_differs": nones}


def experiment(steps):
    """DDP trains both models; then the learner's code, for each step given."""
    models = {"lesson": (lesson_model, {}), "tricky": (Tricky, {"find_unused_parameters": True})}
    references = {}
    for name, (make, options) in models.items():
        references[name] = make()
        train(DDP(references[name], **options))
    dist.all_reduce = logged(dist.all_reduce)  # DDP's own all-reduces are not logged
    found = {}
    for step, function in steps.items():
        found[step] = {}
        for name, (make, _) in models.items():
            try:
                model, times = by_hand(step, function, make)
            except Exception as error:  # reported as a problem, with what was expected
                found[step][name] = {"error": f"{type(error).__name__}: {error}"}
                continue
            found[step][name] = differences(model, references[name])
            if name == "lesson":
                found[step][name]["steps"] = timeline(times)
    return found
def expected_buckets():
    """The elements of each bucket of the lesson's model, in the order they are sent: its
    trainable parameters cut in definition order once a bucket holds CAP or more, the last
    bucket sent first (DDP's rule with find_unused_parameters=True, in elements)."""
    sizes, current = [], 0
    for p in [p for p in lesson_model().parameters() if p.requires_grad]:
        current += p.numel()
        if current >= CAP:
            sizes, current = sizes + [current], 0
    return (sizes + [current] if current else sizes)[::-1]


def problems(rank, step, found):
    """What is wrong, each saying what was expected and what came."""
    wrong = []
    for name, r in found.items():
        where = f"rank {rank}, {name} model"
        if "error" in r:
            wrong.append(f"{where}: your code raised {r['error']}")
            continue
        if not r["max_diff"] < TOLERANCE:
            wrong.append(f"{where}: after {STEPS} steps the weights differ from DDP's by "
                         f"{r['max_diff']:.2g} at {r['where']} (expected < {TOLERANCE:g})")
        if r["grad_none_differs"]:
            wrong.append(f"{where}: gradients None in one model only: "
                         + ", ".join(r["grad_none_differs"]))
    for k, s in enumerate(found["lesson"].get("steps", []), start=1):  # the first bad step
        step_wrong = timing_problems(step, s)
        if step_wrong:
            return wrong + [f"rank {rank}, lesson model, step {k}: {w}" for w in step_wrong]
    return wrong
def timing_problems(step, s):
    sizes = [p.numel() for p in lesson_model().parameters()]
    made = [c for c in s["all_reduces"] if c[2] != len(sizes)]  # not a used-flags all-reduce
    got = [n for _, _, n in made]
    wrong, end = [], s["backward_ms"]
    if step == "buckets" and got != expected_buckets():
        wrong.append(f"all-reduces of {got} elements (expected the buckets, {expected_buckets()})")
    elif step != "buckets" and sorted(got) != sorted(sizes):
        wrong.append(f"all-reduces of {sorted(got)} elements (expected one per parameter, "
                     f"{sorted(sizes)})")
    if step == "after":
        if any(t < end for t, _, _ in made):
            wrong.append(f"an all-reduce started during backward (expected after {end:.2f} ms)")
        return wrong
    if not all(is_async for _, is_async, _ in made):
        wrong.append("an all-reduce without async_op=True (expected all asynchronous)")
    if made and min(t for t, _, _ in made) >= end:
        wrong.append(f"the first all-reduce started at {min(t for t, _, _ in made):.2f} ms, "
                     f"after backward ended at {end:.2f} ms (expected one during backward)")
    started = sum(is_async for _, is_async, _ in s["all_reduces"])
    if len(s["waits"]) != started:
        wrong.append(f"{len(s['waits'])} work.wait() for {started} asynchronous all-reduces "
                     f"(expected one each, before the optimizer step)")
    if s["waits"] and min(s["waits"]) < end:
        wrong.append(f"a wait at {min(s['waits']):.2f} ms, inside backward (ended at "
                     f"{end:.2f} ms): the all-reduces it waits for overlap nothing")
    return wrong


@record
def run_exercise(**steps):
    """The script's main: steps maps after, hooks or buckets to the learner's function."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout, ddp=True)  # lesson 01
    found = experiment(steps)
    for step in steps:
        found[step]["problems"] = problems(rank, step, found[step])
        print(f"rank {rank}, {step}: max |by hand - DDP| " + ", ".join(
            f"{name} {found[step][name].get('max_diff', float('nan')):.1e}"
            for name in ("lesson", "tricky")) + f"; {len(found[step]['problems'])} problem(s)")
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world_size, "ranks": everyone}, f)
    teardown()
