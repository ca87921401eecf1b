"""Exercise (lesson 30): ZeRO by hand. One optimizer step of SGD with momentum, equal to
what it does with the gradient averaged over the ranks, while each rank keeps the momentum
of its own part of the weights only. The run around step, and its data, are in
zero_harness.py.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/30_beyond_allreduce/zero_exercise.py
"""

import torch
import torch.distributed as dist
from zero_harness import run_exercise


def step(weights, grad, state, lr, momentum):
    """Update `weights` (flat, the same on every rank) in place; `grad` is this rank's own
    gradient; keep what must last between steps in the dict `state`."""
    # STUB: dist.all_reduce(grad)
    # STUB: grad /= dist.get_world_size()  # the mean over the ranks, all of it
    # STUB: if "momentum" not in state:
    # STUB:     state["momentum"] = grad.clone()  # SGD's first step: the gradient itself
    # STUB: else:
    # STUB:     state["momentum"].mul_(momentum).add_(grad)
    # STUB: weights -= lr * state["momentum"]
    ### BEGIN SOLUTION
    rank, world_size = dist.get_rank(), dist.get_world_size()
    part = weights.numel() // world_size
    mine = torch.empty(part, dtype=grad.dtype)
    dist.reduce_scatter_single(mine, grad)  # my part of the sum over the ranks
    mine /= world_size  # ... and of the mean
    if "momentum" not in state:
        state["momentum"] = mine.clone()  # SGD's first step: the gradient itself
    else:
        state["momentum"].mul_(momentum).add_(mine)
    updated = weights[rank * part:(rank + 1) * part] - lr * state["momentum"]
    dist.all_gather_single(weights, updated)  # every rank's part, to every rank
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(step)
