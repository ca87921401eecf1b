"""Lesson 31: one small network cut into two stages, for the lesson's scripts to import.

Each stage runs in its own process; in a step (`train_step`), stage 0 sends its activations
to its partner, which sends their gradient back. `reference` trains the whole network on
one process.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import require_torchrun

STAGES, WIDTH, BATCH = 2, 32, 16


def stage_model(stage):
    """The two halves of one network, float64; each seeded the same everywhere."""
    torch.manual_seed(stage)
    if stage == 0:
        layers = [nn.Linear(8, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    else:
        layers = [nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)]
    return nn.Sequential(*layers).double()


def batch(replica, step):
    """Replica `replica`'s batch at `step`: 4 batches of 16 points, in turn."""
    g = torch.Generator().manual_seed(100 * replica + step % 4)
    x = torch.randn(BATCH, 8, generator=g, dtype=torch.float64)
    return x, torch.tanh(x[:, :2].sum(1, keepdim=True))  # to learn: a smooth function


def reference(steps, replicas, lr):
    """The same training on one process, all replicas' samples: each half's weights."""
    model = nn.Sequential(stage_model(0), stage_model(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        xs, ys = zip(*(batch(r, step) for r in range(replicas)))
        optimizer.zero_grad()
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
    return [torch.cat([p.detach().flatten() for p in half.parameters()]) for half in model]


def layout():
    """This rank's (stage, replica, partner) from torchrun's variables, after refusing an
    odd number of processes (before any group is joined). R replicas: ranks 0 .. R-1 run
    stage 0, ranks R .. 2R-1 stage 1, and rank r of stage 0 is the partner of rank r + R."""
    require_torchrun()
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size % STAGES:
        sys.exit(f"{STAGES} stages need an even number of processes, not {world_size}: "
                 f"use --nproc-per-node=4 (2 stages x 2 replicas)")
    replicas = world_size // STAGES
    stage, replica = divmod(int(os.environ["RANK"]), replicas)
    return stage, replica, (1 - stage) * replicas + replica


def train_step(model, stage, partner, x, y):
    """One pipeline step of this rank's stage; returns the loss (0 on stage 0)."""
    if stage == 0:
        h = model(x)
        dist.send(h.detach(), partner)  # activations forward
        grad_h = torch.empty_like(h)
        dist.recv(grad_h, partner)  # their gradient back
        h.backward(grad_h)  # the two backward calls, joined by hand
        return torch.zeros((), dtype=torch.float64)
    h = torch.empty(BATCH, WIDTH, dtype=torch.float64)
    dist.recv(h, partner)
    h.requires_grad_()
    loss = F.mse_loss(model(h), y)
    loss.backward()
    dist.send(h.grad, partner)
    return loss.detach()
