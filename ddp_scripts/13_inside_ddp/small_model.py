"""Lesson 13's small model and data, shared by its three scripts (broadcast.py,
buckets.py, equivalence.py), which import it from this folder."""

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

FEATURES, CLASSES = 16, 4


def make_model(seed, batchnorm=False):
    """A small classifier whose weights depend only on `seed`. Its Linear layers are
    numbered 0, 3 and 5, with the BatchNorm layer or with an Identity in its place."""
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


def wrap(model, device, **options):
    """DDP, naming the rank's GPU on a GPU machine (device_ids is None for a CPU model)."""
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **options)
