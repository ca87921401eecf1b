"""Exercise 5 (lesson 13): DDP by hand, the gradients all-reduced in buckets during backward.
by_hand_harness.py trains two models with attach_buckets and compares them with DDP.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/by_hand_buckets.py
"""

import torch
import torch.distributed as dist
from by_hand_harness import run_exercise


def attach_buckets(model, cap):
    """As attach_hooks, but one all-reduce per bucket: the trainable parameters, cut in the
    order the model defines them once a bucket holds `cap` elements or more, sent last bucket
    first. Returns finish()."""
    # STUB: return lambda: None  # replace with your answer
    ### BEGIN SOLUTION
    buckets, bucket = [], []
    for p in [p for p in model.parameters() if p.requires_grad]:  # frozen: left out
        bucket.append(p)
        if sum(q.numel() for q in bucket) >= cap:
            buckets, bucket = buckets + [bucket], []
    buckets = (buckets + [bucket] if bucket else buckets)[::-1]  # the last layers' go first
    ready, sent = set(), []  # sent: (flat, work) of each bucket on its way

    def send_in_order():  # a bucket goes once all its gradients are ready, in bucket order
        while len(sent) < len(buckets) and all(id(p) in ready for p in buckets[len(sent)]):
            flat = torch.cat([p.grad.flatten() for p in buckets[len(sent)]])
            sent.append((flat, dist.all_reduce(flat, async_op=True)))

    def hook(p):  # autograd calls it once p.grad is complete for this backward
        ready.add(id(p))
        send_in_order()

    def finish():
        params = [p for bucket in buckets for p in bucket]
        used = torch.tensor([float(id(p) in ready) for p in params])
        for p in params:
            if id(p) not in ready:  # unused on this rank: it counts as zero
                p.grad = torch.zeros_like(p)
                ready.add(id(p))
        send_in_order()  # the buckets backward did not complete
        dist.all_reduce(used)  # on how many ranks backward reached each parameter
        ranks = iter(used)
        for bucket, (flat, work) in zip(buckets, sent):
            work.wait()
            flat /= dist.get_world_size()
            for p, part in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad = part.view_as(p) if next(ranks) else None  # None: no rank used it
        ready.clear(), sent.clear()

    for p in (p for bucket in buckets for p in bucket):
        p.register_post_accumulate_grad_hook(hook)
    return finish
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(buckets=attach_buckets)
