"""Lesson 31, exercise 2: the two-process pipeline whose step gpipe_exercise.py writes. Not
a script of its own: the exercise calls run_exercise(gpipe_step), and rank 0 writes what
every rank found as JSON.

One replica, so two processes and no DDP (there is nothing to average): rank 0 runs
stage 0, rank 1 stage 1. The network, its batches and the one-process reference come from
this lesson's module, ddp_scripts/31_pipeline_ddp/two_stages.py. Each step hands `gpipe_step` the
batch of 16 and the number of micro-batches, 4 (--micro sets another); the sends,
receives and forwards it makes are counted, and logged in order for the first step. CPU
and Gloo."""

import argparse
import sys

import torch
import torch.distributed as dist
import two_stages as lesson
from ddp_common import record, report, setup, teardown

STEPS, LR, MICRO = 10, 0.1, 4
POINT_TO_POINT = ("send", "recv", "isend", "irecv")


class CallLog:
    """Counts this rank's sends and receives and logs them, with the model's forwards, in
    the order they happen, during the first step only. A receive is logged once it has
    completed: a blocking recv when it returns, an irecv when its request's wait() does."""

    def __init__(self, model):
        self.counts = {name: 0 for name in POINT_TO_POINT}
        self.order, self.logging = [], True
        self.real = {name: getattr(dist, name) for name in POINT_TO_POINT}
        model.register_forward_pre_hook(lambda module, inputs: self.log("forward"))

    def log(self, event):
        if self.logging:
            self.order.append(event)

    def __enter__(self):  # the exercise's dist.send and others are these, until __exit__
        for name in POINT_TO_POINT:
            setattr(dist, name, self.counted(name))
        return self

    def __exit__(self, *exc):
        for name, function in self.real.items():
            setattr(dist, name, function)

    def counted(self, name):
        def call(*args, **kwargs):
            self.counts[name] += 1
            if name in ("send", "isend"):
                self.log("send")
            result = self.real[name](*args, **kwargs)
            if name == "recv":
                self.log("recv")
            return Received(result, self) if name == "irecv" else result
        return call


class Received:
    """irecv's request: logs the receive when wait() returns, and is the request otherwise."""

    def __init__(self, work, calls):
        self.work, self.calls = work, calls

    def wait(self, *args, **kwargs):
        done = self.work.wait(*args, **kwargs)
        self.calls.log("recv")
        return done

    def __getattr__(self, name):
        return getattr(self.work, name)


@record
def run_exercise(gpipe_step):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a send or receive waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    parser.add_argument("--micro", type=int, default=MICRO,
                        help="micro-batches per step, a divisor of the batch of 16")
    args = parser.parse_args()
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout)  # lesson 02
    if world_size != 2:
        sys.exit(f"this exercise runs one replica: 2 processes, not {world_size}")
    stage, partner = rank, 1 - rank
    model = lesson.stage_model(stage)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with CallLog(model) as calls:
        for step in range(STEPS):
            optimizer.zero_grad()
            gpipe_step(model, stage, partner, *lesson.batch(0, step), args.micro)
            optimizer.step()
            calls.logging = False  # the first step's order is enough
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    want = lesson.reference(STEPS, 1, LR)[stage]
    found = {"rank": rank, "stage": stage, "gap": (mine - want).abs().max().item(),
             "per_step": {name: n / STEPS for name, n in calls.counts.items()},
             "order": calls.order}
    print(f"rank {rank} (stage {stage}): weights off by {found['gap']:.1e}, per step "
          f"{found['per_step']}", flush=True)
    report(args.out, found, micro=args.micro)
    teardown()
