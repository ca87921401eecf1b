"""Lesson 11: pipeline parallelism combined with DDP, by hand and with torch.distributed.pipelining.

A small network split into two stages, each in its own process (stage 0 sends its
activations to stage 1, stage 1 sends their gradient back), and each stage replicated
over a process group of its own (data parallelism): 2 stages x N/2 replicas. First by hand,
with send, recv and DDP; then with torch.distributed.pipelining's GPipe schedule over
micro-batches. Every rank compares its weights with the same training on one process.
Rank 0 logs the loss to TensorBoard. Last, the same processes start torch.distributed.rpc
and call functions on each other. Needs an even number of processes (4 in the lesson).

    torchrun --standalone --nproc-per-node=4 ddp_scripts/11_pipeline_ddp.py
"""

import argparse
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, require_torchrun, setup, teardown
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel as DDP

STAGES, WIDTH, BATCH = 2, 32, 16


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--micro", type=int, default=4, help="micro-batches (section 2)")
    parser.add_argument("--logdir", help="rank 0 writes TensorBoard event files here")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON here")
    return parser.parse_args()


def stage_model(stage):
    """The two halves of one network, float64; each seeded the same everywhere."""
    torch.manual_seed(stage)
    if stage == 0:
        layers = [nn.Linear(8, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    else:
        layers = [nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)]
    return nn.Sequential(*layers).double()


def batch(replica, step):
    """Replica `replica`'s batch at `step`: 4 batches of 16 points, in turn."""
    g = torch.Generator().manual_seed(100 * replica + step % 4)
    x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
    return x, torch.tanh(x[:, :2].sum(1, keepdim=True))  # to learn: a smooth function


def layout(rank, world_size):
    """Ranks 0 .. R-1 run stage 0, ranks R .. 2R-1 stage 1 (R replicas); a replica's two
    stages are partners: rank r of stage 0 talks to rank r + R."""
    replicas = world_size // STAGES
    stage, replica = divmod(rank, replicas)
    partner = (1 - stage) * replicas + replica
    return stage, replica, partner


def stage_groups(world_size):
    """One process group per stage, holding its replicas. Every rank creates every
    group, in the same order, even the groups it is not in: new_group asks it."""
    replicas = world_size // STAGES
    return [dist.new_group(list(range(s * replicas, (s + 1) * replicas)))
            for s in range(STAGES)]


def train_step(model, stage, partner, x, y):
    """One pipeline step of this rank's stage; returns the loss (0 on stage 0)."""
    if stage == 0:
        h = model(x)
        dist.send(h.detach(), partner)  # activations forward
        grad_h = torch.empty_like(h)
        dist.recv(grad_h, partner)  # their gradient back
        h.backward(grad_h)  # DDP all-reduces stage 0's gradients over its group
        return torch.zeros((), dtype=torch.float64)
    h = torch.empty(BATCH, WIDTH, dtype=torch.float64)
    dist.recv(h, partner)
    h.requires_grad_()
    loss = F.mse_loss(model(h), y)
    loss.backward()  # DDP all-reduces stage 1's gradients over its group
    dist.send(h.grad, partner)
    return loss.detach()


def reference(steps, replicas, lr):
    """The same training on one process: the whole network, all replicas' samples."""
    model = nn.Sequential(stage_model(0), stage_model(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        xs, ys = zip(*(batch(r, step) for r in range(replicas)))
        optimizer.zero_grad()
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
    return [torch.cat([p.detach().flatten() for p in half.parameters()]) for half in model]


def train(rank, world_size, args):
    stage, replica, partner = layout(rank, world_size)
    groups = stage_groups(world_size)
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
        optimizer.step()
        total = loss.clone()
        dist.all_reduce(total)  # stage 1's losses summed; stage 0's ranks add zeros
        losses.append(total.item() / (world_size // STAGES))
        if writer:
            writer.add_scalar("loss/train", losses[-1], step)
            writer.add_scalar("time/step_ms", (time.perf_counter() - start) * 1e3, step)
    if writer:
        writer.close()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    gap = (mine - reference(args.steps, world_size // STAGES, args.lr)[stage]).abs().max()
    found = {"rank": rank, "stage": stage, "replica": replica, "partner": partner,
             "group": dist.get_process_group_ranks(groups[stage]),
             "group_sum": int(probe.item()), "gap": gap.item(),
             "losses": losses}
    del model, optimizer
    return found


def timeline(model, events):
    """Note when each micro-batch's forward and backward start and end on this stage."""
    clock = time.perf_counter
    model.register_forward_pre_hook(lambda module, inputs: events.append(["F", clock()]))
    model.register_forward_hook(lambda module, inputs, output: events[-1].append(clock()))
    model.register_full_backward_pre_hook(lambda module, grads: events.append(["B", clock()]))
    model[0].weight.register_hook(lambda grad: events[-1].append(clock()))  # its last gradient


def pipelined(rank, world_size, args):
    """The same training with torch.distributed.pipelining: GPipe over micro-batches."""
    stage, replica, _ = layout(rank, world_size)
    replicas = world_size // STAGES
    groups = stage_groups(world_size)
    pipes = [dist.new_group([k, replicas + k]) for k in range(replicas)]  # a replica's stages
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
    return {"gap": gap.item(), "micro": args.micro, "events": quickest[1]}


def describe(rank):
    """Runs wherever RPC sends it: who and where am I?"""
    return {"asked_for": rank, "pid": os.getpid(), "rank": int(os.environ["RANK"])}


def remote_rpc(rank, world_size):
    """The same processes as RPC workers: rank 0 calls a function on every worker, and
    keeps a reference (RRef) to a tensor that stays on the last one."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=20))
    found = {"warnings": sorted({str(w.message) for w in caught}), "torch": torch.__version__}
    if rank == 0:
        found["answers"] = [rpc.rpc_sync(f"worker{r}", describe, args=(r,))
                            for r in range(world_size)]
        held = rpc.remote(f"worker{world_size - 1}", torch.arange, args=(4,))
        found["rref"] = {"owner": held.owner().name, "value": held.to_here().tolist()}
    rpc.shutdown()  # waits for every worker: a barrier
    return found


@record
def main():
    args = parse_args()
    require_torchrun()
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size % STAGES:
        sys.exit(f"{STAGES} stages need an even number of processes, not {world_size}: "
                 f"use --nproc-per-node=4 (2 stages x 2 replicas)")
    world = setup("cpu", ddp=True)  # lesson 01; ddp=True: lesson 05, "A clean exit"
    found = {"train": train(world.rank, world_size, args)}
    found["train"]["pipelining"] = pipelined(world.rank, world_size, args)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found["train"])
    teardown()
    found["rpc"] = remote_rpc(world.rank, world_size)
    if world.rank == 0:
        print(f"{world_size} ranks: {STAGES} stages x {world_size // STAGES} replicas trained, "
              f"RPC answered", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "ranks": everyone, "rpc": found["rpc"]}, f)


if __name__ == "__main__":
    main()
