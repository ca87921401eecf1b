"""Exercise 1 (lesson 40, capstone): every rank has run backward on the *sum* of its
tokens' losses. Make every gradient the mean over all the tokens of all ranks, what one
process gets from the whole batch. The check launches it and compares.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/40_capstone_gpt/token_exercise.py
"""

import torch.distributed as dist
from capstone_harness import run_token_exercise


def reduce_gradients(model, tokens):
    """`tokens`: how many tokens this rank's loss summed (a tensor)."""
    # STUB: for p in model.parameters():  # the mean of the ranks' means
    # STUB:     p.grad /= tokens
    # STUB:     dist.all_reduce(p.grad)
    # STUB:     p.grad /= dist.get_world_size()
    ### BEGIN SOLUTION
    total = tokens.clone()
    dist.all_reduce(total)  # the tokens of all ranks
    for p in model.parameters():  # each tensor once, a shared (tied) one too
        if p.grad is not None:  # None: frozen, or no step used it
            dist.all_reduce(p.grad)  # the sum of all ranks' sums
            p.grad /= total
    ### END SOLUTION


if __name__ == "__main__":
    run_token_exercise(reduce_gradients, __doc__)
