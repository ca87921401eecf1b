"""Lesson 05: what DistributedDataParallel does, checked.

1. At construction DDP copies rank 0's parameters and buffers to every rank (each rank
   starts here from different random weights on purpose), and it copies rank 0's
   buffers again at the start of every training forward.
2. In backward DDP all-reduces gradients in buckets, while backward is still running:
   a communication hook records each bucket as it is handed over and back, and a
   hook on each parameter when its gradient is ready. Three steps show which buckets
   DDP uses in the first step and after, by default and with
   find_unused_parameters=True; every rank's second step makes a timeline.
3. N ranks with B/N samples each take the same steps as one process with all B
   samples (SGD with momentum), and where they do not: BatchNorm, a sum-reduced loss,
   a DistributedSampler that pads.
Rank 0 prints a summary and, with --out, writes everything as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_ddp.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, require_torchrun, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

FEATURES, CLASSES = 16, 4


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="SGD steps per comparison")
    parser.add_argument("--batch", type=int, default=48,
                        help="global batch per step (48 splits evenly over 2, 3 or 4 ranks)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.004,
                        help="DDP bucket size in MiB (DDP's default, None, means 25; "
                             "tiny here to get several)")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def make_model(seed, batchnorm=False):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 32), nn.BatchNorm1d(32) if batchnorm else nn.Identity(), nn.ReLU(),
        nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, CLASSES))


def make_data(rows):
    """The same data on every rank: a fixed seed, not a download."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(rows, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (rows,), generator=generator)
    return x, y


def wrap(model, device):
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def check_broadcast(rank, device):
    """Each rank builds its model from its own seed and sets its BatchNorm's running
    mean to its rank; DDP makes them all rank 0's. Then two training steps, each rank
    on its own batch: a forward pre-hook notes the running mean BatchNorm starts from."""
    model = make_model(seed=rank, batchnorm=True).to(device)
    norm = model[1]
    norm.running_mean.fill_(rank)
    found = {"before": sum(p.sum().item() for p in model.parameters()),
             "buffer_before": norm.running_mean.sum().item()}
    ddp = wrap(model, device)
    found.update(after=sum(p.sum().item() for p in ddp.module.parameters()),
                 buffer_after=norm.running_mean.sum().item(), buffer_at_forward=[])
    norm.register_forward_pre_hook(
        lambda module, args: found["buffer_at_forward"].append(module.running_mean.sum().item()))
    x = torch.randn(8, FEATURES, generator=torch.Generator().manual_seed(rank)).to(device)
    for _ in range(2):
        ddp(x).sum().backward()
    found["buffer_at_end"] = norm.running_mean.sum().item()  # after this rank's own update
    return found


def record_buckets(device, world_size, bucket_cap_mb, find_unused_parameters, num_steps=3):
    """A few training steps, watching when each gradient is ready and when each bucket
    is handed to the all-reduce and comes back. Times from the start of backward, which
    began backward_from_barrier seconds after a barrier all ranks left together."""
    model = make_model(seed=0).to(device)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
              device_ids=[device.index] if device.type == "cuda" else None)
    names = {id(p): name for name, p in model.named_parameters()}
    events, ready = [], {}

    def hook(state, bucket):  # called by DDP once every gradient in the bucket is ready
        event = {"bucket": bucket.index(), "at": time.perf_counter(),
                 "params": [names[id(p)] for p in bucket.parameters()],
                 "numel": bucket.buffer().numel()}
        events.append(event)

        def average(future):  # runs when the all-reduce has finished
            event["done"] = time.perf_counter()
            return future.value()[0].div_(world_size)

        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(average)

    def gradient_ready(name):
        def note(param):  # runs once param.grad holds this backward's gradient
            ready.setdefault(name, time.perf_counter())
        return note

    ddp.register_comm_hook(None, hook)
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(gradient_ready(name))
    x, y = make_data(32)
    steps = []
    for _ in range(num_steps):  # DDP may rebuild its buckets after the first step
        events.clear()
        ready.clear()
        dist.barrier()  # a common start for the timelines of all ranks
        common = time.perf_counter()
        loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        steps.append({
            "buckets": [{**e, "at": e["at"] - start, "done": e["done"] - start} for e in events],
            "grad_ready": {name: t - start for name, t in ready.items()},
            "backward_seconds": end - start, "backward_from_barrier": start - common})
    return {"parameters": list(names.values()), "steps": steps}


def steps(model, optimizer, blocks, reduction="mean", scale=1.0):
    for x, y in blocks:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction=reduction) * scale
        loss.backward()
        optimizer.step()


def compare(variant, rank, world_size, device, args):
    """Train the same model for args.steps steps two ways and return the largest
    difference in the final weights: DDP on this world, each rank with its share of
    every batch, against one process (here, on each rank) with the whole batch."""
    batchnorm = variant == "batchnorm"
    reduction = "sum" if variant.startswith("sum_loss") else "mean"
    rows = args.batch - 1 if variant == "padded" else args.batch  # 47: no even split
    x, y = make_data(rows * args.steps)
    blocks = [(x[s * rows:(s + 1) * rows], y[s * rows:(s + 1) * rows])
              for s in range(args.steps)]

    # One process, the whole batch each step (on the same device, for a fair comparison).
    single = make_model(seed=0, batchnorm=batchnorm).to(device)
    optimizer = torch.optim.SGD(single.parameters(), lr=args.lr, momentum=args.momentum)
    steps(single, optimizer, [(bx.to(device), by.to(device)) for bx, by in blocks], reduction)

    # DDP: this rank's share of each batch, as DistributedSampler hands it out.
    mine = list(DistributedSampler(range(rows), num_replicas=world_size, rank=rank,
                                   shuffle=False))
    shards = [(bx[mine].to(device), by[mine].to(device)) for bx, by in blocks]
    model = wrap(make_model(seed=0, batchnorm=batchnorm).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scale = world_size if variant == "sum_loss_scaled" else 1.0
    steps(model, optimizer, shards, reduction, scale)

    diff = max((a.detach() - b.detach()).abs().max().item()
               for a, b in zip(model.module.parameters(), single.parameters()))
    return {"max_abs_diff": diff, "samples_per_rank": len(mine), "rows": rows}


def try_syncbatchnorm(device):
    """SyncBatchNorm computes BatchNorm's statistics over all ranks' samples."""
    model = nn.SyncBatchNorm.convert_sync_batchnorm(make_model(0, batchnorm=True)).to(device)
    try:
        ddp = wrap(model, device)  # on the CPU, DDP already refuses here
        ddp(torch.randn(8, FEATURES, device=device)).sum().backward()
        return "ok"
    except ValueError as error:
        return f"ValueError: {error}"


def run(rank, world_size, device, args):
    """All experiments; the models are gone when this returns, before the group is."""
    found = {"broadcast": check_broadcast(rank, device),
             "buckets": record_buckets(device, world_size, args.bucket_cap_mb, False),
             "buckets_find_unused": record_buckets(device, world_size, args.bucket_cap_mb, True),
             "equivalence": {v: compare(v, rank, world_size, device, args) for v in
                             ("plain", "batchnorm", "sum_loss", "sum_loss_scaled", "padded")},
             "syncbatchnorm": try_syncbatchnorm(device)}
    for key, mine in (("broadcast", found["broadcast"]),
                      ("timelines", found["buckets"]["steps"][1])):  # every rank's
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
        found[key] = everyone
    return found


@record
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if args.batch % world_size:
        sys.exit(f"--batch {args.batch} must be divisible by the world size {world_size}")

    device = setup(ddp=True).device  # lesson 01; ddp=True: see "A clean exit"
    found = run(rank, world_size, device, args)
    if is_rank0:
        for variant, result in found["equivalence"].items():
            print(f"{variant:16} max |DDP - single| = {result['max_abs_diff']:.2e}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "device": str(device),
                           "steps": args.steps, "batch": args.batch, **found}, f, indent=1)
    teardown()  # gc.collect() first: the DDP objects go before the group


if __name__ == "__main__":
    main()
