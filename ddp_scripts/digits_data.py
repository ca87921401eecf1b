"""Lesson 05 in practice: scikit-learn's handwritten digits (1797 images of 8x8 pixels,
shipped with the package: no download), split the same way on every rank, a small model
and its accuracy measured across ranks. Imported by 05_sampler.py, 05_evaluate.py and
05_ddp_training.py."""

import torch
import torch.distributed as dist
import torch.nn as nn
from sklearn.datasets import load_digits
from torch.utils.data import DistributedSampler, TensorDataset

TEST_SIZE = 357  # of 1797: leaves 1440 for training, divisible by 1, 2, 3 and 4 ranks


def load_data(seed=0):
    """The digits, shuffled once with a fixed seed (the same on every rank), then split."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float64)  # pixels 0..16 -> 0..1
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    test = TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE])
    return TensorDataset(x[TEST_SIZE:], y[TEST_SIZE:]), test


def make_model(seed=0):
    """A small two-layer network, in float64 so that runs with different numbers of ranks
    can be compared closely."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).double()


def correct_answers(model, x, y, device):
    """1 for each sample the model gets right, 0 otherwise (model is the plain module:
    evaluation needs no gradients, so no DDP and no collectives in its forward)."""
    with torch.no_grad():
        return (model(x.to(device)).argmax(1) == y.to(device)).double()


def evaluate(model, test, rank, world_size, device):
    """Accuracy on the test set, three ways (every rank holds the same weights)."""
    x, y = test.tensors
    single = correct_answers(model, x, y, device).mean().item()  # one process, all of it

    # Naive: DistributedSampler pads the shards to equal size, and each rank's accuracy
    # is averaged as if the shards were disjoint and equal.
    padded = list(DistributedSampler(test, num_replicas=world_size, rank=rank, shuffle=False))
    mine = torch.stack([correct_answers(model, x[padded], y[padded], device).mean(),
                        torch.tensor(len(padded), dtype=torch.float64, device=device)])
    dist.all_reduce(mine)
    naive, naive_count = mine[0].item() / world_size, int(mine[1].item())

    # Right: disjoint, unpadded shards; all-reduce the sums and the counts, divide once.
    shard = list(range(rank, len(y), world_size))
    totals = torch.stack([correct_answers(model, x[shard], y[shard], device).sum(),
                          torch.tensor(len(shard), dtype=torch.float64, device=device)])
    dist.all_reduce(totals)
    return {"single": single, "naive": naive, "naive_count": naive_count,
            "reduced": totals[0].item() / totals[1].item(), "reduced_count": int(totals[1])}
