"""Lesson 03, exercise 3: the DDP run whose `fit` loop
ddp_scripts/03_ddp_training/training_exercise.py writes. Not a script of its own: the exercise calls
run_exercise(fit), and rank 0 writes what every rank saw and found as JSON.

48 training and 25 evaluation points in the plane, labelled by the side of a line with
1 label in 5 flipped; a linear model; SGD. 48 and the global batch of 12 divide by 1 to
4 ranks, 25 by none of 2, 3 and 4. CPU and Gloo on any machine."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TRAIN, EVAL, BATCH = 48, 25, 12
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
    """(correct, count) on this rank's part of the evaluation set: positions rank,
    rank + n, ..."""
    rank, n = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        right = model.module(x).argmax(1) == y
    correct, count = int(right[rank::n].sum()), len(right[rank::n])
    log["part"].append([correct, count])
    log["whole"].append(int(right.sum()) / len(y))  # the reference: all of it, on one rank
    return correct, count


def build(seed=0):
    """The arguments of fit: model, optimizer, loader, sampler, evaluation set."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TRAIN + EVAL, 2, generator=g, dtype=torch.float64)
    y = (x[:, 0] + x[:, 1] > 0).long() ^ (torch.rand(TRAIN + EVAL, generator=g) < 0.2).long()
    train_set = TensorDataset(x[:TRAIN], y[:TRAIN], torch.arange(TRAIN))  # with its index
    sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=BATCH // dist.get_world_size(), sampler=sampler)
    torch.manual_seed(seed)
    model = DDP(torch.nn.Linear(2, 2).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return model, optimizer, loader, sampler, (x[TRAIN:], y[TRAIN:])


@record
def run_exercise(fit):
    parser = arguments(sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    args = parser.parse_args()
    rank = setup("cpu", timeout_s=args.timeout, ddp=True).rank  # CPU and Gloo, any machine
    log["reported"] = reported = fit(*build())
    print(f"rank {rank} reports accuracy {reported}", flush=True)
    report(args.out, log, train_size=TRAIN, reported=reported)  # rank 0's reported
    teardown()
