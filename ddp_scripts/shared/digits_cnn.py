"""Lesson 00 (DDP in ten minutes): what its two training scripts share."""

import argparse
import gzip
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn


def parse_args(doc):
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the results as JSON here")
    return parser.parse_args()


def load_data():
    """1536 digits (8x8 pixels) to train on, 261 to test on, shuffled once: the file
    scikit-learn ships (no download), read without importing it (a second saved)."""
    sklearn = Path(importlib.util.find_spec("sklearn").submodule_search_locations[0])
    with gzip.open(sklearn / "datasets" / "data" / "digits.csv.gz") as f:
        table = torch.from_numpy(np.loadtxt(f, delimiter=",", dtype=np.float32))
    order = torch.randperm(len(table), generator=torch.Generator().manual_seed(0))
    x = table[order, :64].view(-1, 1, 8, 8) / 16  # pixels 0..16 -> 0..1
    y = table[order, 64].long()
    return torch.utils.data.TensorDataset(x[:1536], y[:1536]), (x[1536:], y[1536:])


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 96, 3, padding=1), nn.Tanh(),
        nn.Conv2d(96, 96, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(96 * 8 * 8, 10))


def test_accuracy(model, test, device):
    x, y = test
    with torch.no_grad():
        return (model(x.to(device)).argmax(1) == y.to(device)).float().mean().item()


def compute_rate(seconds=0.15):
    """Matrix products per second, in a window all ranks start at once (a barrier)."""
    a, b = torch.randn(2, 256, 256, generator=torch.Generator().manual_seed(0))
    a @ b  # the first product sets things up: not timed
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return calls / (time.perf_counter() - start)


class Meter:
    """Samples/s after step 1; the share of a core it had; compute_rate() at start and end."""

    def __init__(self):
        self.samples, self.start = 0, None
        self.rates = [compute_rate()]

    def count(self, n):
        self.samples += n
        if self.start is None:
            self.start, self.cpu, self.warm_up = time.perf_counter(), time.process_time(), n

    def results(self):
        seconds = time.perf_counter() - self.start
        return {"samples": self.samples, "per_second": (self.samples - self.warm_up) / seconds,
                "cpu_share": (time.process_time() - self.cpu) / seconds,
                "compute_rates": self.rates + [compute_rate()]}
