"""Lesson 06: skewed processing speeds, made visible and provoked on purpose.

With defaults it runs these experiments one after the other and rank 0 writes what
each rank saw as JSON:

1. straggler: one rank is slowed by a known delay per step; every rank records, per
   step, when it started, when its gradients were ready and when the all-reduce ended;
2. monitored_barrier: one rank arrives late and rank 0 names it;
3. mismatch: rank 0 runs a collective the others do not, without and with the
   DETAIL debug level;
4. uneven inputs without Join: rank 0 has more batches and times out;
5. what Join costs: the all-reduces one forward pass starts, without and with Join;
6. uneven inputs with Join (SGD with momentum), with and without
   divide_by_initial_world_size: gradients, weights and momentum on every rank;
7. Join with an all-reduce of our own in the loop: it hangs; then the fix,
   throw_on_early_termination=True.

Experiments 2 to 4 and the first half of 7 fail on purpose. They run on their own Gloo
groups with a short timeout (--short-timeout), catch the error and record it, so the
script goes on.

With --stall-at STEP, the experiments are followed by a stall: the ranks train on a
Gloo group of their own, whose timeout is --stall-timeout, until the slow rank stalls
at that step for ten timeouts. The others give up and the whole job fails, as it would
in real life.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/06_skewed_speeds.py
    torchrun --standalone --nproc-per-node=2 ddp_scripts/06_skewed_speeds.py \\
        --stall-at 3 --stall-timeout 2
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, require_torchrun, setup, teardown
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="straggler steps")
    parser.add_argument("--delay", type=float, default=0.1,
                        help="seconds the slow rank sleeps in each step")
    parser.add_argument("--slow-rank", type=int, default=None,
                        help="the rank that is slow (default: the last one)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="timeout of the main process group, seconds")
    parser.add_argument("--short-timeout", type=float, default=1.0,
                        help="timeout of the groups used for the failures, seconds")
    parser.add_argument("--batches", type=int, nargs=2, default=[6, 4],
                        metavar=("RANK0", "OTHERS"),
                        help="batches of rank 0 and of every other rank (uneven inputs)")
    parser.add_argument("--stall-at", type=int, default=None,
                        help="after the experiments, stall the slow rank at this step, "
                             "past --stall-timeout: the job fails")
    parser.add_argument("--stall-timeout", type=float, default=2.0,
                        help="timeout of the group the stall trains on, seconds")
    parser.add_argument("--device", choices=["auto", "cpu"], default="auto")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def make_model(device, buffers=False):
    torch.manual_seed(0)
    layers = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)]
    if buffers:  # BatchNorm's running statistics are buffers: DDP keeps them in sync
        layers.insert(1, nn.BatchNorm1d(64))
    return nn.Sequential(*layers).to(device=device, dtype=torch.float64)


def batch(step, rank, device):
    """A batch that depends only on (step, rank): the same in every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 32, generator=g, dtype=torch.float64)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def wrap(model, device, group=None, **kwargs):
    return DDP(model, process_group=group,
               device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def elapsed_since(start):
    return round(time.perf_counter() - start, 3)


# 1. A straggler ---------------------------------------------------------------------

def straggler(rank, slow, args, device):
    """Per step: start, gradients ready (seen by a communication hook), all-reduce done."""
    ddp = wrap(make_model(device), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ready = []

    def hook(state, bucket):  # DDP calls it when this rank's gradients are all computed
        ready.append(time.perf_counter())
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return future.then(lambda f: f.value()[0].div_(dist.get_world_size()))

    ddp.register_comm_hook(None, hook)
    dist.barrier()  # a common start line, so that the ranks' clocks can be compared
    origin = time.perf_counter()
    timeline = []
    for step in range(args.steps):
        start = time.perf_counter()
        if rank == slow:
            time.sleep(args.delay)  # a slow data loader, a slower GPU, a busy node...
        x, y = batch(step, rank, device)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()  # returns once the all-reduce has finished ...
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # ... on a GPU: once it is queued, so wait here
        end = time.perf_counter()
        optimizer.step()
        timeline.append({"start": start - origin, "ready": max(ready) - origin,
                         "end": end - origin})
        ready.clear()
    return timeline


# 2-3. Diagnosis ---------------------------------------------------------------------

def attempt(action):
    """Run a collective that is expected to fail; return how it ended and how fast."""
    start = time.perf_counter()
    try:
        action()
        return {"error": None, "seconds": elapsed_since(start)}
    except Exception as error:  # the error is the result of the experiment
        return {"error": f"{type(error).__name__}: {error}", "seconds": elapsed_since(start)}


def late_for_monitored_barrier(rank, slow, args):
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.short_timeout))
    if rank == slow:
        time.sleep(args.short_timeout)  # twice the barrier's timeout: far too late
    return attempt(lambda: dist.monitored_barrier(
        group=group, timeout=timedelta(seconds=args.short_timeout / 2), wait_all_ranks=True))


def mismatched_collective(rank, args, detail):
    """Rank 0 all-reduces a metric (say, for a log line) that the other ranks never
    reduce: they are already at the next collective, a broadcast."""
    level = dist.get_debug_level()
    if detail:  # groups created from now on check every collective across ranks first
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.short_timeout))
    dist.set_debug_level(level)  # back to what it was, for the groups created later
    metric = torch.ones(3)
    if rank == 0:
        return attempt(lambda: dist.all_reduce(metric, group=group))
    return attempt(lambda: dist.broadcast(metric, src=0, group=group))


# 4-7. Uneven inputs -----------------------------------------------------------------

def batches_of(rank, args):
    return args.batches[0] if rank == 0 else args.batches[1]


def uneven_without_join(rank, args):
    """Rank 0 has more batches than the others. They finish their loop and wait at the
    end-of-training barrier (on the main group); rank 0's next all-reduce has no partner."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.short_timeout))
    ddp = wrap(make_model(torch.device("cpu")), torch.device("cpu"), group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    n_batches = batches_of(rank, args)
    steps_done, outcome = 0, None
    for step in range(n_batches):
        x, y = batch(step, rank, torch.device("cpu"))
        optimizer.zero_grad()
        outcome = attempt(lambda x=x, y=y: F.mse_loss(ddp(x), y).backward())
        if outcome["error"]:
            break
        optimizer.step()
        steps_done += 1
    return {"batches": n_batches, "steps_done": steps_done, **outcome}


def same(tensors, others):
    """Equal up to float64 rounding (DDP may divide by N where we multiply by 1/N)."""
    return all(torch.allclose(t, o, rtol=1e-12, atol=1e-15) for t, o in zip(tensors, others))


class CountedAllReduces:
    """Counts the calls to dist.all_reduce while it is active. DDP's and Join's Python
    code calls it through torch.distributed (DDP's gradient all-reduces start in C++
    and are not counted: the forward pass has none)."""

    def __enter__(self):
        self.calls, self.real = 0, dist.all_reduce

        def counted(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.real


def all_reduces_per_forward(rank, device):
    """All-reduces started by each of three forward passes, every rank with the same
    number of batches, and by one forward pass after the loop (outside any Join)."""
    counts = {}
    for label, buffers, join in [("plain", False, None), ("join", False, {}),
                                 ("join_buffers", True, {}),
                                 ("join_throw", False, {"throw_on_early_termination": True})]:
        ddp = wrap(make_model(device, buffers), device)
        per_forward = []
        with Join([ddp], **join) if join is not None else contextlib.nullcontext():
            for step in range(3):
                x, y = batch(step, rank, device)
                with CountedAllReduces() as counter:
                    output = ddp(x)
                per_forward.append(counter.calls)
                F.mse_loss(output, y).backward()
        with CountedAllReduces() as counter:  # one more forward pass, after the block
            output = ddp(x)
        F.mse_loss(output, y).backward()
        counts[label] = {"per_forward": per_forward, "after_the_block": counter.calls}
    return counts


def fingerprint(tensors):
    """A short hash of the tensors' bytes: equal fingerprints, equal tensors."""
    flat = torch.cat([t.detach().flatten().cpu() for t in tensors])
    return hashlib.sha1(bytes(flat.view(torch.uint8).tolist())).hexdigest()[:10]


def momentum_of(optimizer):
    return [optimizer.state[p]["momentum_buffer"] for group in optimizer.param_groups
            for p in group["params"]]


def uneven_with_join(rank, world_size, args, device, divide_by_initial_world_size):
    """The same uneven loop inside Join, with momentum. On rank 0's extra steps, compare
    the gradient DDP leaves with the gradient of rank 0's batch alone. Then take one more
    step on every rank."""
    model = make_model(device)
    ddp = wrap(model, device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    n_batches = batches_of(rank, args)
    extra_steps, optimizer_steps = [], 0
    with Join([ddp], divide_by_initial_world_size=divide_by_initial_world_size):
        for step in range(n_batches):
            x, y = batch(step, rank, device)
            optimizer.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            if step >= args.batches[1]:  # the others have joined: only this rank is left
                alone = make_model(device)
                alone.load_state_dict(model.state_dict())
                F.mse_loss(alone(x), y).backward()
                own = [p.grad for p in alone.parameters()]
                got = [p.grad for p in model.parameters()]
                extra_steps.append({
                    "step": step,
                    "equals_own_gradient": same(got, own),
                    "equals_own_gradient_over_world_size": same(
                        got, [o / world_size for o in own]),
                })
            optimizer.step()
            optimizer_steps += 1
        weights_own = fingerprint(model.parameters())  # before Join's exit runs
    found = {"batches": n_batches, "extra_steps": extra_steps,
             "optimizer_steps": optimizer_steps, "weights_own": weights_own,
             "weights_after": fingerprint(model.parameters()),
             "momentum_after": fingerprint(momentum_of(optimizer))}
    x, y = batch(100, rank, device)  # one more step, every rank: the next epoch begins
    optimizer.zero_grad()
    F.mse_loss(ddp(x), y).backward()
    optimizer.step()
    found["weights_next_step"] = fingerprint(model.parameters())
    return found


def join_with_a_metric(rank, args, device, throw):
    """The uneven loop inside Join, plus an all-reduce of our own in every step (the
    loss summed over the ranks, for a log line). Join knows nothing of it."""
    if throw:  # the fix, where a real script has it: the metric on DDP's (default) group
        ddp_group = metric_group = None
    else:  # short timeouts, and the metric on a group of its own, to catch the failure
        short = timedelta(seconds=args.short_timeout)
        ddp_group = dist.new_group(backend="gloo", timeout=short)
        metric_group = dist.new_group(backend="gloo", timeout=short)
        device = torch.device("cpu")
    model = make_model(device)
    ddp = wrap(model, device, ddp_group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    n_batches = batches_of(rank, args)
    steps, error = 0, None
    where, since = "start", time.perf_counter()
    try:
        with Join([ddp], throw_on_early_termination=throw):
            for step in range(n_batches):
                where, since = "training", time.perf_counter()
                x, y = batch(step, rank, device)
                optimizer.zero_grad()
                loss = F.mse_loss(ddp(x), y)
                loss.backward()
                optimizer.step()
                where, since = "metric", time.perf_counter()
                dist.all_reduce(loss.detach(), group=metric_group)
                steps += 1
            where, since = "joined", time.perf_counter()  # Join's exit runs next
    except RuntimeError as failure:  # the error is the result of the experiment
        error = f"{type(failure).__name__}: {failure}"
    found = {"batches": n_batches, "steps": steps, "where": where, "error": error,
             "seconds": elapsed_since(since)}
    if throw:
        found["weights"] = fingerprint(model.parameters())
        found["momentum"] = fingerprint(momentum_of(optimizer))
    return found


# --stall-at -------------------------------------------------------------------------

def stall(rank, slow, args, found):
    """After the experiments: train until the slow rank stops answering for ten timeouts
    at --stall-at, on a Gloo group (CPU) whose timeout is --stall-timeout."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.stall_timeout))
    device = torch.device("cpu")
    ddp = wrap(make_model(device), device, group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(args.stall_at + 2):
        if rank == slow and step == args.stall_at:
            print(f"rank {rank}: stalling at step {step} for {10 * args.stall_timeout:g} s",
                  flush=True)
            time.sleep(10 * args.stall_timeout)
        x, y = batch(step, rank, device)
        optimizer.zero_grad()
        started = time.perf_counter()  # the step's own work takes milliseconds
        try:
            F.mse_loss(ddp(x), y).backward()
        except Exception as error:
            waited = elapsed_since(started)
            print(f"rank {rank}: step {step}: gave up waiting after {waited:.2f} s "
                  f"(timeout {args.stall_timeout:g} s)", flush=True)
            if rank == 0 and args.out:
                found["stall"] = {"step": step, "waited": waited,
                                  "timeout": args.stall_timeout,
                                  "error": f"{type(error).__name__}: {error}"}
                with open(args.out, "w") as f:
                    json.dump(found, f)
            raise  # the job must fail: torchrun stops the others and reports it
        optimizer.step()


@record  # an exception that ends main() goes into torchrun's report (lesson 00)
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size < 2:
        sys.exit("this lesson needs at least 2 processes: --nproc-per-node=2 or more")
    slow = world_size - 1 if args.slow_rank is None else args.slow_rank
    if not 0 < slow < world_size:
        sys.exit(f"--slow-rank must be between 1 and {world_size - 1}: rank 0 reports")
    device = setup(args.device, timeout_s=args.timeout, ddp=True).device  # lessons 01, 05

    found = {"world_size": world_size, "slow_rank": slow, "delay": args.delay,
             "steps": args.steps, "short_timeout": args.short_timeout,
             "batches": args.batches, "backend": dist.get_backend(), "device": str(device),
             "nccl_async_error_handling": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")}
    mine = {"timeline": straggler(rank, slow, args, device)}
    dist.barrier()
    mine["monitored_barrier"] = late_for_monitored_barrier(rank, slow, args)
    dist.barrier()
    mine["mismatch"] = mismatched_collective(rank, args, detail=False)
    dist.barrier()
    mine["mismatch_detail"] = mismatched_collective(rank, args, detail=True)
    dist.barrier()
    mine["uneven"] = uneven_without_join(rank, args)
    dist.barrier()  # the others wait here while rank 0 waits for its partner
    mine["join_costs"] = all_reduces_per_forward(rank, device)
    mine["join"] = uneven_with_join(rank, world_size, args, device, True)
    mine["join_no_divide"] = uneven_with_join(rank, world_size, args, device, False)
    mine["join_metric"] = join_with_a_metric(rank, args, device, throw=False)
    dist.barrier()
    mine["join_metric_throw"] = join_with_a_metric(rank, args, device, throw=True)

    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    if rank == 0 and args.out:
        for key in mine:
            found[key] = [r[key] for r in everyone]
        with open(args.out, "w") as f:
            json.dump(found, f)
    if args.stall_at is not None:
        stall(rank, slow, args, found)
        sys.exit("the stalled rank never stalled: is --stall-at within the run?")
    teardown()


if __name__ == "__main__":
    main()
