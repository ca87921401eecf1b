"""Lesson 13, section 3: N ranks with B/N samples each take the same steps as one process
with all B samples (SGD with momentum), and where they do not: BatchNorm, a sum-reduced
loss, a DistributedSampler that pads. Last, SyncBatchNorm, the remedy for BatchNorm.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/equivalence.py
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from small_model import FEATURES, make_data, make_model, wrap
from torch.utils.data import DistributedSampler

VARIANTS = ("plain", "batchnorm", "sum_loss", "sum_loss_scaled", "padded")


def steps(model, optimizer, blocks, reduction="mean", scale=1.0):
    for x, y in blocks:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y, reduction=reduction) * scale
        loss.backward()
        optimizer.step()


def compare(variant, world, args):
    """Train the same model for args.steps steps two ways and return the largest
    difference in the final weights: DDP on this world, each rank with its share of
    every batch, against one process (here, on each rank) with the whole batch."""
    batchnorm = variant == "batchnorm"
    reduction = "sum" if variant.startswith("sum_loss") else "mean"
    rows = args.batch - 1 if variant == "padded" else args.batch  # 47: no even split
    x, y = make_data(rows * args.steps)
    blocks = [(x[s * rows:(s + 1) * rows].to(world.device),
               y[s * rows:(s + 1) * rows].to(world.device)) for s in range(args.steps)]

    # One process, the whole batch each step (on the same device, for a fair comparison).
    single = make_model(seed=0, batchnorm=batchnorm).to(world.device)
    optimizer = torch.optim.SGD(single.parameters(), lr=args.lr, momentum=args.momentum)
    steps(single, optimizer, blocks, reduction)

    # DDP: this rank's share of each batch, as DistributedSampler hands it out.
    mine = list(DistributedSampler(range(rows), num_replicas=world.world_size,
                                   rank=world.rank, shuffle=False))
    model = wrap(make_model(seed=0, batchnorm=batchnorm).to(world.device), world.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scale = world.world_size if variant == "sum_loss_scaled" else 1.0
    steps(model, optimizer, [(bx[mine], by[mine]) for bx, by in blocks], reduction, scale)

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


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--steps", type=int, default=5, help="SGD steps per comparison")
    parser.add_argument("--batch", type=int, default=48,
                        help="global batch per step (48 splits evenly over 2, 3 or 4 ranks)")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()
    world = setup(args.device, ddp=True)
    if args.batch % world.world_size:
        teardown()
        sys.exit(f"--batch {args.batch} must be divisible by the world size {world.world_size}")
    found = {variant: compare(variant, world, args) for variant in VARIANTS}
    if world.rank == 0:
        for variant, result in found.items():
            print(f"{variant:16} max |DDP - single| = {result['max_abs_diff']:.2e}")
    report(args.out, {v: r["max_abs_diff"] for v, r in found.items()},  # every rank's
           device=str(world.device), steps=args.steps, batch=args.batch,
           equivalence=found, syncbatchnorm=try_syncbatchnorm(world.device))  # rank 0's
    teardown()


if __name__ == "__main__":
    main()
