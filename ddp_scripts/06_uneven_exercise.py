"""Exercise (lesson 06): make an uneven DDP loop finish; the last rank has fewer batches.
Each rank also trains a plain model on every rank's batches, as DDP with Join should.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/06_uneven_exercise.py
"""

import argparse
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def train(ddp, optimizer, batches):
    """One optimizer step per batch of this rank; `batches` may be shorter on some ranks."""
    # STUB: for x, y in batches:
    # STUB:     optimizer.zero_grad()
    # STUB:     F.mse_loss(ddp(x), y).backward()
    # STUB:     optimizer.step()
    ### BEGIN SOLUTION
    with Join([ddp]):
        for x, y in batches:
            optimizer.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            optimizer.step()
    ### END SOLUTION


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)  # the same in every process
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True)


def reference(counts):
    """Step s: the gradients of the ranks with an s-th batch, summed, / the world size."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(max(counts)):
        optimizer.zero_grad()
        have = [batch(step, r) for r, n in enumerate(counts) if step < n]
        (sum(F.mse_loss(model(x), y) for x, y in have) / len(counts)).backward()
        optimizer.step()
    return list(model.parameters())


@record
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, nargs=2, default=[4, 2], metavar=("MOST", "LAST"))
    parser.add_argument("--timeout", type=float, default=10, help="seconds, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit(f"{sys.argv[0]}: RANK not set: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    counts = [args.batches[0]] * (n - 1) + [args.batches[1]]
    ddp = DDP(make_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = []  # counted outside train(): one entry per optimizer step
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    train(ddp, optimizer, (batch(step, rank) for step in range(counts[rank])))
    dist.barrier()  # every rank has left train()
    weights = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    expected = torch.cat([p.detach().flatten() for p in reference(counts)])
    found = {"optimizer_steps": len(steps), "weights": weights.tolist(),
             "matches_reference": torch.allclose(weights, expected, rtol=1e-12, atol=1e-15)}
    everyone = [None] * n
    dist.all_gather_object(everyone, found)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": n, "counts": counts, "ranks": everyone}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
