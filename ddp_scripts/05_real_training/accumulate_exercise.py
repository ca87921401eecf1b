"""Exercise (lesson 05): one optimizer step from several micro-batches of different
sizes, equal to one step on all of them at once, with as few all-reduces as DDP needs.
The run around train_step, and its data, are in accumulate_harness.py.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_real_training/accumulate_exercise.py
"""

import torch.nn.functional as F
from accumulate_harness import run_exercise


def train_step(model, optimizer, micro_batches):
    """One optimizer step from micro_batches, a list of (x, y) of different sizes."""
    optimizer.zero_grad()
    # STUB: for x, y in micro_batches:
    # STUB:     loss = F.cross_entropy(model(x), y)
    # STUB:     loss.backward()
    ### BEGIN SOLUTION
    total = sum(len(y) for _, y in micro_batches)
    *first, last = micro_batches
    with model.no_sync():  # forward and backward: gradients accumulate, no all-reduce
        for x, y in first:
            (F.cross_entropy(model(x), y) * len(y) / total).backward()
    x, y = last
    (F.cross_entropy(model(x), y) * len(y) / total).backward()  # all-reduces the sum
    ### END SOLUTION
    optimizer.step()


if __name__ == "__main__":
    run_exercise(train_step)
