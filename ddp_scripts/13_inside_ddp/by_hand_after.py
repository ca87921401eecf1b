"""Exercise 3 (lesson 13): DDP by hand, the gradients averaged after backward.
by_hand_harness.py trains two models with average_gradients and compares them with DDP.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/by_hand_after.py
"""

import torch
import torch.distributed as dist
from by_hand_harness import run_exercise


def average_gradients(model):
    """Called after each backward: make every gradient its mean over the ranks, as DDP does."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    params = [p for p in model.parameters() if p.requires_grad]  # frozen ones: left out
    used = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(used)  # on how many ranks backward reached each parameter
    for p, ranks in zip(params, used):
        if ranks == 0:
            continue  # used on no rank: its gradient stays None, as with DDP
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # unused here only: it counts as zero
        dist.all_reduce(p.grad)  # the sum over the ranks, in place
        p.grad /= dist.get_world_size()
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(after=average_gradients)
