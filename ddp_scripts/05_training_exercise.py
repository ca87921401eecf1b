"""Exercise (lesson 05, in practice): fix the two bugs in `fit`. Each epoch must visit the
training set in a new order; the accuracy reported must be over the whole evaluation set.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_training_exercise.py
"""

import argparse
import datetime
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TRAIN, EVAL, BATCH = 48, 25, 12  # 48 and 12 divide by 1 to 4 ranks, 25 by none of 2, 3, 4
log = {"seen": [], "part": [], "whole": []}  # what this rank saw and found, for the check


def train_one_epoch(model, optimizer, loader):
    """One pass over this rank's shard, logging the sample indices in the order seen."""
    log["seen"].append([])
    for x, y, index in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        log["seen"][-1] += index.tolist()


def evaluate(model, x, y):
    """(correct, count) on this rank's part of the evaluation set, positions rank, rank + n,
    ...: no padding, so the parts differ in size when n does not divide the set."""
    rank, n = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        right = model.module(x).argmax(1) == y
    correct, count = int(right[rank::n].sum()), len(right[rank::n])
    log["part"].append([correct, count])
    log["whole"].append(int(right.sum()) / len(y))  # the reference: all of it, on one rank
    return correct, count


def fit(model, optimizer, loader, sampler, evaluation, epochs=3):
    """Train; returns the accuracy on the evaluation set after each epoch."""
    reported = []
    # STUB: for epoch in range(epochs):
    # STUB:     train_one_epoch(model, optimizer, loader)
    # STUB:     correct, count = evaluate(model, *evaluation)
    # STUB:     reported.append(correct / count)
    ### BEGIN SOLUTION
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        train_one_epoch(model, optimizer, loader)
        totals = torch.tensor(evaluate(model, *evaluation))  # this rank's correct, count
        dist.all_reduce(totals)  # sums over all ranks
        reported.append(totals[0].item() / totals[1].item())
    ### END SOLUTION
    return reported


def train(seed=0):
    """Points labelled by the side of a line, 1 label in 5 flipped; a linear model."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TRAIN + EVAL, 2, generator=g, dtype=torch.float64)
    y = (x[:, 0] + x[:, 1] > 0).long() ^ (torch.rand(TRAIN + EVAL, generator=g) < 0.2).long()
    train_set = TensorDataset(x[:TRAIN], y[:TRAIN], torch.arange(TRAIN))  # with its index
    sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=BATCH // dist.get_world_size(), sampler=sampler)
    torch.manual_seed(seed)
    model = DDP(torch.nn.Linear(2, 2).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return fit(model, optimizer, loader, sampler, (x[TRAIN:], y[TRAIN:]))


@record
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timeout", type=float, default=20, help="seconds, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit(f"{sys.argv[0]}: RANK not set: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    reported = train()
    gc.collect()  # DDP objects can sit in reference cycles: free them before the group goes
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, log)
    print(f"rank {dist.get_rank()} reports accuracy {reported}", flush=True)
    if dist.get_rank() == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"train_size": TRAIN, "reported": reported, "ranks": everyone}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
