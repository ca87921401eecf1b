"""Lesson 03, exercise 3: the DDP run around the `fit` that
ddp_scripts/03_ddp_training/training_exercise.py defines. Not a script of its own: the exercise
calls run_exercise(fit), and rank 0 writes what every rank saw and found as JSON.

48 training and 25 evaluation points in the plane, labelled by the side of a line with
1 label in 5 flipped; a linear model; SGD. 48 and the global batch of 12 divide by 1 to
4 ranks, 25 by none of 2, 3 and 4. Each rank holds only its part of the evaluation set.
CPU and Gloo on any machine."""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TRAIN, EVAL, BATCH = 48, 25, 12
log = {"seen": [], "part": [], "weights": [], "after_epochs": []}  # for the check


def train_one_epoch(model, optimizer, loader):
    """One pass over this rank's shard, logging the sample indices in the order seen."""
    log["seen"].append([])
    for x, y, index in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        log["seen"][-1] += index.tolist()


def evaluate(model, x, y):
    """(correct, count) on this rank's part of the evaluation set (what build hands it)."""
    with torch.no_grad():
        correct = int((model.module(x).argmax(1) == y).sum())
    log["part"].append([correct, len(y)])
    log["weights"].append([p.tolist() for p in model.module.parameters()])
    log["after_epochs"].append(len(log["seen"]))  # epochs trained when it evaluated
    return correct, len(y)


def build(seed=0):
    """The arguments of fit: model, optimizer, loader, sampler, and this rank's part of
    the evaluation set (positions rank, rank + n, ...)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TRAIN + EVAL, 2, generator=g, dtype=torch.float64)
    y = (x[:, 0] + x[:, 1] > 0).long() ^ (torch.rand(TRAIN + EVAL, generator=g) < 0.2).long()
    train_set = TensorDataset(x[:TRAIN], y[:TRAIN], torch.arange(TRAIN))  # with its index
    sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=BATCH // n, sampler=sampler)
    torch.manual_seed(seed)
    model = DDP(torch.nn.Linear(2, 2).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return model, optimizer, loader, sampler, (x[TRAIN:][rank::n], y[TRAIN:][rank::n])


@record
def run_exercise(fit):
    parser = arguments(sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the data and model")
    args = parser.parse_args()
    rank = setup("cpu", timeout_s=args.timeout, ddp=True).rank  # CPU and Gloo, any machine
    log["reported"] = reported = fit(*build(args.seed))
    print(f"rank {rank} reports accuracy {reported}", flush=True)
    report(args.out, log, train_size=TRAIN, eval_size=EVAL, reported=reported)
    teardown()
