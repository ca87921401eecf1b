"""Exercise 4 (lesson 13): DDP by hand, each gradient's all-reduce started during backward.
by_hand_harness.py trains two models with attach_hooks and compares them with DDP.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/by_hand_hooks.py
"""

import torch
import torch.distributed as dist
from by_hand_harness import run_exercise


def attach_hooks(model):
    """Called once, before training: start each gradient's all-reduce as soon as backward has
    it, without waiting. Returns finish(), which the harness calls after each backward."""
    # STUB: return lambda: None  # replace with your answer
    ### BEGIN SOLUTION
    order = [p for p in model.parameters() if p.requires_grad][::-1]  # last layers first
    ready, works = set(), []

    def send_in_order():  # every rank sends the same gradients in the same order
        while len(works) < len(order) and id(order[len(works)]) in ready:
            works.append(dist.all_reduce(order[len(works)].grad, async_op=True))

    def hook(p):  # autograd calls it once p.grad is complete for this backward
        ready.add(id(p))
        send_in_order()

    def finish():
        used = torch.tensor([float(id(p) in ready) for p in order])
        for p in order:
            if id(p) not in ready:  # unused on this rank: it counts as zero
                p.grad = torch.zeros_like(p)
                ready.add(id(p))
        send_in_order()  # what backward did not reach
        dist.all_reduce(used)  # on how many ranks backward reached each parameter
        for p, work, ranks in zip(order, works, used):
            work.wait()
            p.grad = p.grad / dist.get_world_size() if ranks else None  # None: no rank used it
        ready.clear(), works.clear()

    for p in order:
        p.register_post_accumulate_grad_hook(hook)
    return finish
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(hooks=attach_hooks)
