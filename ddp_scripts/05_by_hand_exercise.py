"""Exercise (lesson 05): DDP by hand: gradients averaged after backward (step 1), during it
(step 2), in buckets (step 3). by_hand_harness.py trains with each and compares with DDP.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_by_hand_exercise.py
"""

import torch
import torch.distributed as dist
from by_hand_harness import run_exercise


def average_gradients(model):
    """Step 1, called after backward: make every gradient its mean over the ranks."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    for p in model.parameters():
        dist.all_reduce(p.grad)  # the sum over the ranks, in place
        p.grad /= dist.get_world_size()
    ### END SOLUTION


def attach_hooks(model, pending):
    """Step 2, called once before training: as soon as backward has a parameter's gradient,
    start its all-reduce without waiting for it, and note (parameter, work) in `pending`."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    def start(p):  # called by autograd once p.grad is complete for this backward
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(start)
    ### END SOLUTION


def finish(pending):
    """Step 2, called after each backward: wait for the all-reduces, then take the mean."""
    # STUB: pending.clear()  # replace with your answer
    ### BEGIN SOLUTION
    for p, work in pending:
        work.wait()
        p.grad /= dist.get_world_size()
    pending.clear()
    ### END SOLUTION


def attach_buckets(model, pending, cap):
    """Step 3: as step 2, but once the ready, unsent gradients hold `cap` elements or more (or
    no parameter is left), start one all-reduce of them flattened: note (params, flat, work)."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    ready, count = [], len(list(model.parameters()))

    def start(p):
        ready.append(p)
        sent = sum(len(params) for params, _, _ in pending)
        if sum(q.numel() for q in ready) >= cap or sent + len(ready) == count:
            flat = torch.cat([q.grad.flatten() for q in ready])
            pending.append((list(ready), flat, dist.all_reduce(flat, async_op=True)))
            ready.clear()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(start)
    ### END SOLUTION


def finish_buckets(pending):
    """Step 3, after each backward: wait, then copy each bucket's mean back into the grads."""
    # STUB: pending.clear()  # replace with your answer
    ### BEGIN SOLUTION
    for params, flat, work in pending:
        work.wait()
        flat /= dist.get_world_size()
        for p, part in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(part.view_as(p.grad))
    pending.clear()
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(average_gradients, attach_hooks, finish, attach_buckets, finish_buckets)
