"""Exercise (lesson 21): make an uneven DDP loop finish; the last rank has fewer batches.
The run around `train`, and the reference it must match, are in uneven_harness.py.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/uneven_exercise.py
"""

import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from uneven_harness import run_exercise


def train(ddp, optimizer, batches):
    """One optimizer step per batch of this rank; `batches` may be shorter on some ranks."""
    # STUB: for x, y in batches:
    # STUB:     optimizer.zero_grad()
    # STUB:     F.mse_loss(ddp(x), y).backward()
    # STUB:     optimizer.step()
    ### BEGIN SOLUTION
    with Join([ddp]):
        for x, y in batches:
            optimizer.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            optimizer.step()
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(train)
