"""Lesson 13, exercises 3 to 5: DDP by hand (by_hand_*.py call run_exercise). Two models,
the lesson's and one with frozen, tied and unused parameters, trained in DDP and with the
learner's code, whose all-reduces are timed against backward. CPU and Gloo everywhere."""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from small_model import CLASSES, FEATURES, make_model
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, BATCH = 4, 24  # the global batch: 24 divides by 1, 2, 3 and 4 ranks
CAP = 1000  # exercise 5: a bucket closes once it holds this many elements or more (--cap)
TOLERANCE = 1e-6  # measured: 3.0e-8 at most at 2, 3 and 4 ranks (sums in another order)
calls = []  # (seconds, async_op, elements) of every dist.all_reduce the learner's code makes
waits = []  # seconds at which the learner's code waited on an asynchronous all-reduce


class Tricky(nn.Module):
    """Frozen, tied and unused parameters, as in the models people fine-tune."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.frozen = nn.Linear(FEATURES, 32).requires_grad_(False)  # a frozen layer
        self.tied, self.again = nn.Linear(32, 32), nn.Linear(32, 32)
        self.again.weight = self.tied.weight  # one Parameter, used by two layers
        self.never, self.even, self.head = (nn.Linear(32, CLASSES) for _ in range(3))
        self.head.bias.requires_grad_(False)  # a frozen bias

    def forward(self, x):  # self.never: no rank uses it; self.even: the even ranks only
        h = F.relu(self.again(F.relu(self.tied(F.relu(self.frozen(x))))))
        return self.head(h) + (self.even(h) if dist.get_rank() % 2 == 0 else 0)


def train(model, after_backward=lambda: None):
    """SGD on this rank's share of each batch; per step, in ms from backward's start: its end,
    and the start of each of the learner's all-reduces and waits."""
    g = torch.Generator().manual_seed(1234)
    share = BATCH // dist.get_world_size()
    mine = slice(dist.get_rank() * share, (dist.get_rank() + 1) * share)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, FEATURES, generator=g)
        y = torch.randint(0, CLASSES, (BATCH,), generator=g)
        optimizer.zero_grad()  # the gradients are None again
        loss = F.cross_entropy(model(x[mine]), y[mine])
        calls.clear(), waits.clear()
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        after_backward()
        optimizer.step()
        steps.append({"backward_ms": 1e3 * (end - start),
                      "all_reduces": [[1e3 * (t - start), op, n] for t, op, n in calls],
                      "waits": [1e3 * (t - start) for t in waits]})
    return steps


def difference(mine, ddp):
    """The largest weight difference from DDP's model; each gradient None in one model only."""
    diffs, nones = [], []
    for (name, p), q in zip(mine.named_parameters(), ddp.parameters()):
        diffs.append((p.detach() - q.detach()).abs().max())
        if (p.grad is None) != (q.grad is None):
            nones.append(f"{name}.grad is {'None' if p.grad is None else 'a tensor'} (expected "
                         f"{'None' if q.grad is None else 'a tensor'}, as in DDP)")
    return torch.stack(diffs).max().item(), nones  # NaN if any is NaN


def one_per_parameter(made):
    sizes = sorted(p.numel() for p in make_model(seed=0).parameters())
    got = sorted(n for _, _, n in made)
    return [] if got == sizes else [
        f"all-reduces of {got} elements (expected one per parameter, {sizes})"]


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


def experiment(functions):
    """DDP trains both models, then the learner's code does, for each step given."""
    references = {"lesson": make_model(seed=0), "tricky": Tricky()}
    train(DDP(references["lesson"]))
    train(DDP(references["tricky"], find_unused_parameters=True))
    dist.all_reduce = logged(dist.all_reduce)  # from here on, each call is noted
    found = {step: {"problems": [], "max_diff": {}} for step in functions}
    for step, function in functions.items():
        for name, model in (("lesson", make_model(seed=0)), ("tricky", Tricky())):
            where, wrong = f"rank {dist.get_rank()}, {name} model", []
            try:  # after: called after each backward; hooks, buckets: once, before training
                finish = (lambda: function(model)) if step == "after" else (  # noqa: B023
                    function(model, CAP) if step == "buckets" else function(model))
                steps = train(model, finish)
            except Exception as error:  # reported as a problem, with what was expected
                wrong.append(f"{where}: your code raised {type(error).__name__}: {error}")
            else:
                worst, nones = difference(model, references[name])
                found[step]["max_diff"][name] = worst
                wrong += [f"{where}: {none}" for none in nones]
                if not worst < TOLERANCE:  # NaN too
                    wrong.append(f"{where}: after {STEPS} steps the weights differ from DDP's by "
                                 f"{worst:.2g} (expected < {TOLERANCE:g})")
                if name == "lesson":
                    found[step]["steps"], wrong = steps, wrong + timing(step, steps, where)
            found[step]["problems"] += wrong
    return found


def timing(step, steps, where):
    """The first step whose all-reduces break the exercise's rules, and how."""
    flags = len(list(make_model(seed=0).parameters()))  # the used-flags all-reduce: not counted
    for k, s in enumerate(steps, start=1):
        if wrong := RULES[step]([c for c in s["all_reduces"] if c[2] != flags], s):
            return [f"{where}, step {k}: {w}" for w in wrong]
    return []


def after_backward(made, s):  # exercise 3: one all-reduce per parameter, after backward
    late = any(t < s["backward_ms"] for t, _, _ in made)
    return one_per_parameter(made) + late * [
        f"an all-reduce started during backward (expected after {s['backward_ms']:.2f} ms)"]


RULES = {"after": after_backward}  # the pieces of exercises 4 and 5 add theirs


@record
def run_exercise(**functions):
    """The script's main: functions maps after, hooks or buckets to the learner's function."""
    parser = arguments(sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20, help="seconds a collective waits")
    parser.add_argument("--cap", type=int, default=CAP, help="exercise 5: a bucket's elements")
    args = parser.parse_args()
    globals()["CAP"] = args.cap  # attach_buckets's cap, and the buckets the check expects
    setup("cpu", timeout_s=args.timeout, ddp=True)  # CPU models, Gloo, on any machine
    report(args.out, experiment(functions))
    teardown()


def during_backward(made, s):  # exercises 4 and 5
    """All-reduces with async_op=True, the first started during backward, and one wait()
    each, all after backward (an all-reduce waited for inside backward overlaps nothing)."""
    wrong, end = [], s["backward_ms"]
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


RULES["hooks"] = lambda made, s: one_per_parameter(made) + during_backward(made, s)


def expected_buckets():
    """The elements of each bucket of the lesson's model, in the order they are sent: its
    trainable parameters cut in definition order once a bucket holds CAP or more, the last
    bucket sent first (DDP's rule with find_unused_parameters=True, in elements)."""
    sizes, current = [], 0
    for p in [p for p in make_model(seed=0).parameters() if p.requires_grad]:
        current += p.numel()
        if current >= CAP:
            sizes, current = sizes + [current], 0
    return (sizes + [current] if current else sizes)[::-1]


def in_buckets(made, s):  # exercise 5: one all-reduce per bucket, during backward
    got, buckets = [n for _, _, n in made], expected_buckets()
    wrong = [] if got == buckets else [
        f"all-reduces of {got} elements (expected the buckets, {buckets})"]
    return wrong + during_backward(made, s)


RULES["buckets"] = in_buckets
