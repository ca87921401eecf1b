"""Lesson 30, section 1: communication hooks that compress DDP's gradients.

A small MLP trained with DDP under three hooks (plain all-reduce, fp16_compress_hook,
PowerSGD), the bytes each sends counted by wire.py; the gradients' storages counted, with
and without gradient_as_bucket_view; bf16_compress_hook tried.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/30_beyond_allreduce/compression_hooks.py
"""

import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP
from wire import wire

HOOKS = {"allreduce": default_hooks.allreduce_hook,  # DDP's own all-reduce, seen by wire
         "fp16": default_hooks.fp16_compress_hook, "powerSGD": powerSGD.powerSGD_hook}


def regression(rank, device, width=256):
    """This rank's 64 points of a made-up task (8 targets); an MLP of 133 640 parameters."""
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(rank))
    w = torch.randn(width, 8, generator=torch.Generator().manual_seed(1000))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                        nn.Linear(256, 8))
    return x.to(device), (x @ w / width**0.5).to(device), mlp.to(device)


def with_hook(name, rank, device, steps=30, **ddp_options):
    """Train the MLP with one communication hook; the wire counted after 5 steps."""
    x, y, mlp = regression(rank, device)
    model = DDP(mlp, **ddp_options)
    state = None if name != "powerSGD" else powerSGD.PowerSGDState(
        None, matrix_approximation_rank=1, start_powerSGD_iter=2)  # plain all-reduce before
    model.register_comm_hook(state, HOOKS[name])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counts, losses, start = {}, [], time.perf_counter()
    for step in range(steps):
        with wire(counts) if step >= 5 else contextlib.nullcontext():
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    del model, optimizer
    calls = sum(n for key, n in counts.items() if key != "bytes")
    return {"bytes_per_step": counts["bytes"] / (steps - 5), "calls_per_step": calls / (steps - 5),
            "seconds_per_step": (time.perf_counter() - start) / steps, "first_loss": losses[0],
            "last_loss": losses[-1], "grad_storages": len(storages)}


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: lesson 13, "A clean exit"
    found = {name: with_hook(name, world.rank, world.device) for name in HOOKS}
    found["bucket_view"] = with_hook("allreduce", world.rank, world.device,
                                     gradient_as_bucket_view=True)  # each .grad in its bucket
    mlp = regression(world.rank, world.device)[2]
    found["parameters"] = sum(p.numel() for p in mlp.parameters())
    found["cuda_build"] = torch.version.cuda is not None or torch.version.hip is not None
    try:  # a build without CUDA refuses it, when it is registered
        DDP(mlp).register_comm_hook(None, default_hooks.bf16_compress_hook)
        found["bf16_error"] = None
    except TypeError as error:
        found["bf16_error"] = str(error)
    report(args.out, found)
    teardown()


if __name__ == "__main__":
    main()
