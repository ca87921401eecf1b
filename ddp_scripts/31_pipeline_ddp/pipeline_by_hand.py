"""Lesson 31, section 1: a pipeline of two stages, each stage replicated with DDP.

The network of two_stages.py, stage 0 and stage 1 in different processes exchanging
activations and gradients with send and recv, each stage wrapped in DDP over a process group
of its own: 2 stages x N/2 replicas. Every rank compares its weights with the same training
on one process. Rank 0 logs the loss to TensorBoard.
    torchrun --standalone --nproc-per-node=4 ddp_scripts/31_pipeline_ddp/pipeline_by_hand.py
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from ddp_common import record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from two_stages import STAGES, batch, layout, reference, stage_model, train_step


def train(rank, world_size, args):
    stage, replica, partner = layout()
    replicas = world_size // STAGES
    groups = [dist.new_group(list(range(s * replicas, (s + 1) * replicas)))  # every rank
              for s in range(STAGES)]  # creates every group, in the same order
    probe = torch.tensor([2.0**rank], dtype=torch.float64)
    dist.all_reduce(probe, group=groups[stage])  # bit q set: rank q took part
    model = DDP(stage_model(stage), process_group=groups[stage])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    writer = None
    if rank == 0 and args.logdir:  # one writer for the job: on rank 0
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(args.logdir)
    losses = []
    for step in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = train_step(model, stage, partner, *batch(replica, step))
        optimizer.step()  # DDP averaged the gradients over this stage's replicas
        total = loss.clone()
        dist.all_reduce(total)  # stage 1's losses summed; stage 0's ranks add zeros
        losses.append(total.item() / replicas)
        if writer:
            writer.add_scalar("loss/train", losses[-1], step)
            writer.add_scalar("time/step_ms", (time.perf_counter() - start) * 1e3, step)
    if writer:
        writer.close()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    gap = (mine - reference(args.steps, replicas, args.lr)[stage]).abs().max()
    del model, optimizer
    return {"rank": rank, "stage": stage, "replica": replica, "partner": partner,
            "group": dist.get_process_group_ranks(groups[stage]), "pid": os.getpid(),
            "group_sum": int(probe.item()), "gap": gap.item(), "losses": losses}


@record
def main():
    parser = argparse.ArgumentParser(  # no --device: the stages run on the CPU
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--logdir", help="rank 0 writes TensorBoard event files here")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON here")
    args = parser.parse_args()
    layout()  # refuses an odd number of processes, before any group is joined
    world = setup("cpu", ddp=True)  # ddp=True: lesson 13, "A clean exit"
    report(args.out, train(world.rank, world.world_size, args))
    teardown()


if __name__ == "__main__":
    main()
