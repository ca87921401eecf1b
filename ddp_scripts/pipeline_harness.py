"""Lesson 11, exercise 2: the run whose `place` ddp_scripts/11_placement_exercise.py writes.
Not a script of its own: the exercise calls run_exercise(place), and rank 0 writes what
every rank found as JSON.

The network, its batches, one pipeline step and the one-process reference come from this
lesson's script, ddp_scripts/11_pipeline_ddp.py. `place(rank, world_size)` decides where
this rank sits: its stage, its replica, the rank it exchanges activations with, and the
process group its DDP averages over. CPU and Gloo; an even number of processes."""

import argparse
import importlib
import json
import sys

import torch
import torch._dynamo  # noqa: F401  before the process group: lesson 05, "A clean exit"
import torch.distributed as dist
from ddp_common import setup, teardown
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

lesson = importlib.import_module("11_pipeline_ddp")  # a name import cannot spell
STEPS, LR = 10, 0.1


@record
def run_exercise(place):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout)  # lesson 01
    stage, replica, partner, group = place(rank, world_size)
    model = DDP(lesson.stage_model(stage), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        lesson.train_step(model, stage, partner, *lesson.batch(replica, step))
        optimizer.step()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    want = lesson.reference(STEPS, world_size // lesson.STAGES, LR)[stage]
    found = {"rank": rank, "stage": stage, "replica": replica, "partner": partner,
             "group": dist.get_process_group_ranks(group), "gap": (mine - want).abs().max().item()}
    del model, optimizer
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    print(f"rank {rank}: stage {stage}, replica {replica}, partner {partner}, "
          f"DDP over {found['group']}, weights off by {found['gap']:.1e}", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"ranks": everyone}, f)
    teardown()
