"""Lesson 31, section 2: the same pipeline with torch.distributed.pipelining.

The network of two_stages.py trained with ScheduleGPipe over micro-batches: each replica's
two stages form a PipelineStage pair, the schedule does the sends and receives, and each
stage's gradients are averaged over its replicas by hand. Every rank compares its weights
with the same training on one process, and notes when each forward and backward ran.
    torchrun --standalone --nproc-per-node=4 ddp_scripts/31_pipeline_ddp/pipelining.py
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import record, report, setup, teardown
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from two_stages import STAGES, batch, layout, reference, stage_model


def timeline(model, events):
    """Note when each micro-batch's forward and backward start and end on this stage."""
    clock = time.perf_counter
    model.register_forward_pre_hook(lambda module, inputs: events.append(["F", clock()]))
    model.register_forward_hook(lambda module, inputs, output: events[-1].append(clock()))
    model.register_full_backward_pre_hook(lambda module, grads: events.append(["B", clock()]))
    model[0].weight.register_hook(lambda grad: events[-1].append(clock()))  # its last gradient


def pipelined(world_size, args):
    """GPipe over micro-batches; returns the gap to one process and the quickest step."""
    stage, replica, _ = layout()
    replicas = world_size // STAGES
    groups = [dist.new_group(list(range(s * replicas, (s + 1) * replicas))) for s in range(STAGES)]
    pipes = [dist.new_group([k, replicas + k]) for k in range(replicas)]  # replica k's stages
    model, events = stage_model(stage), []
    timeline(model, events)
    schedule = ScheduleGPipe(PipelineStage(model, stage, STAGES, torch.device("cpu"),
                                           group=pipes[replica]),
                             n_microbatches=args.micro, loss_fn=F.mse_loss)
    optimizer, quickest = torch.optim.SGD(model.parameters(), lr=args.lr), None
    for step in range(args.steps):
        x, y = batch(replica, step)
        optimizer.zero_grad()
        dist.barrier()  # all ranks start the step together: their clocks line up
        events.clear()
        start = time.perf_counter()
        schedule.step(x) if stage == 0 else schedule.step(target=y)
        took = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the step ends with its slowest rank
        if quickest is None or took.item() < quickest[0]:  # the least disturbed step
            quickest = (took.item(), [[kind, *(t - start for t in ts)] for kind, *ts in events])
        for p in model.parameters():  # DDP's work, by hand: the mean over the replicas
            dist.all_reduce(p.grad, group=groups[stage])
            p.grad /= replicas
        optimizer.step()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    gap = (mine - reference(args.steps, replicas, args.lr)[stage]).abs().max()
    return {"rank": dist.get_rank(), "stage": stage, "replica": replica, "gap": gap.item(),
            "micro": args.micro, "events": quickest[1]}


@record
def main():
    parser = argparse.ArgumentParser(  # no --device: the stages run on the CPU
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON here")
    args = parser.parse_args()
    layout()  # refuses an odd number of processes, before any group is joined
    world = setup("cpu")
    report(args.out, pipelined(world.world_size, args))
    teardown()


if __name__ == "__main__":
    main()
