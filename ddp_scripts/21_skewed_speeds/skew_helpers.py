"""Lesson 21: what its scripts share. A small model, batches that depend only on
(step, rank), DDP on any group, the slow rank, and a way to run a collective that is
meant to fail."""

import hashlib
import sys
import time

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model(device, buffers=False):
    torch.manual_seed(0)
    layers = [nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)]
    if buffers:  # BatchNorm's running statistics are buffers: DDP keeps them in sync
        layers.insert(1, nn.BatchNorm1d(64))
    return nn.Sequential(*layers).to(device=device, dtype=torch.float64)


def batch(step, rank, device):
    """A batch that depends only on (step, rank): the same in every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 32, generator=g, dtype=torch.float64)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


def wrap(model, device, group=None, **kwargs):
    return DDP(model, process_group=group,
               device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def pick_slow_rank(choice, world_size):
    """--slow-rank, checked (default: the last rank). Not rank 0: rank 0 reports."""
    if world_size < 2:
        sys.exit("this lesson needs at least 2 processes: --nproc-per-node=2 or more")
    slow = world_size - 1 if choice is None else choice
    if not 0 < slow < world_size:
        sys.exit(f"--slow-rank must be between 1 and {world_size - 1}: rank 0 reports")
    return slow


def elapsed_since(start):
    return round(time.perf_counter() - start, 3)


def attempt(action):
    """Run a collective that is expected to fail; return how it ended and how fast."""
    start = time.perf_counter()
    try:
        action()
        return {"error": None, "seconds": elapsed_since(start)}
    except Exception as error:  # the error is the result of the experiment
        return {"error": f"{type(error).__name__}: {error}", "seconds": elapsed_since(start)}


def fingerprint(tensors):
    """A short hash of the tensors' bytes: equal fingerprints, equal tensors."""
    flat = torch.cat([t.detach().flatten().cpu() for t in tensors])
    return hashlib.sha1(bytes(flat.view(torch.uint8).tolist())).hexdigest()[:10]


def momentum_of(optimizer):
    return [optimizer.state[p]["momentum_buffer"] for group in optimizer.param_groups
            for p in group["params"]]
