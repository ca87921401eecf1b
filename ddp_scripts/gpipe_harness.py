"""Lesson 11, exercise 2: the two-process pipeline whose step ddp_scripts/11_gpipe_exercise.py
writes. Not a script of its own: the exercise calls run_exercise(gpipe_step), and rank 0
writes what every rank found as JSON.

One replica, so two processes and no DDP (there is nothing to average): rank 0 runs
stage 0, rank 1 stage 1. The network, its batches and the one-process reference come from
this lesson's script, ddp_scripts/11_pipeline_ddp.py. Each step hands `gpipe_step` the
batch of 16 and the number of micro-batches, 4; the sends and receives it makes are
counted. CPU and Gloo."""

import argparse
import importlib
import json
import sys

import torch
import torch.distributed as dist
from ddp_common import setup, teardown
from torch.distributed.elastic.multiprocessing.errors import record

lesson = importlib.import_module("11_pipeline_ddp")  # a name import cannot spell
STEPS, LR, MICRO = 10, 0.1, 4
POINT_TO_POINT = ("send", "recv", "isend", "irecv")


@record
def run_exercise(gpipe_step):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a send or receive waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout)  # lesson 01
    if world_size != 2:
        sys.exit(f"this exercise runs one replica: 2 processes, not {world_size}")
    stage, partner = rank, 1 - rank
    model = lesson.stage_model(stage)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    counts = {name: 0 for name in POINT_TO_POINT}
    real = {name: getattr(dist, name) for name in POINT_TO_POINT}

    def counted(name):
        def call(*args, **kwargs):
            counts[name] += 1
            return real[name](*args, **kwargs)
        return call
    for name in POINT_TO_POINT:
        setattr(dist, name, counted(name))
    try:
        for step in range(STEPS):
            optimizer.zero_grad()
            gpipe_step(model, stage, partner, *lesson.batch(0, step), MICRO)
            optimizer.step()
    finally:
        for name, function in real.items():
            setattr(dist, name, function)
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    want = lesson.reference(STEPS, 1, LR)[stage]
    found = {"rank": rank, "stage": stage, "gap": (mine - want).abs().max().item(),
             "per_step": {name: n / STEPS for name, n in counts.items()}}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    print(f"rank {rank} (stage {stage}): weights off by {found['gap']:.1e}, per step "
          f"{found['per_step']}", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"micro": MICRO, "ranks": everyone}, f)
    teardown()
