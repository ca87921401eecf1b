"""Lesson 30, exercise 2: the run whose `step` zero_exercise.py writes. Not a script of its
own: the exercise calls run_exercise(step), and rank 0 writes what every
rank found as JSON.

A linear regression whose weights are one flat vector of 48 float64 values (48 divides
by 1 to 4 ranks), trained for 4 steps with SGD and momentum. Each rank computes the
gradient on its own batch and hands it to `step`, which must update the weights, in place,
to what SGD with momentum makes of the gradient averaged over the ranks. The reference
does exactly that with an all-reduce and torch.optim.SGD. The collectives `step` calls
are counted (wire.py, section 1). CPU and Gloo."""

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import record, report, setup, teardown
from wire import wire

SIZE, STEPS, LR, MOMENTUM = 48, 4, 0.1, 0.9


@record
def run_exercise(step):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()  # no --device: the exercise's tensors live on the CPU
    rank, _, world_size, _ = setup("cpu", timeout_s=args.timeout)  # lesson 02
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(16, SIZE, generator=g, dtype=torch.float64)
    y = x.sum(1) + 0.1 * torch.randn(16, generator=g, dtype=torch.float64)
    weights = torch.zeros(SIZE, dtype=torch.float64)  # the same on every rank
    reference = torch.zeros(SIZE, dtype=torch.float64, requires_grad=True)
    reference_optimizer = torch.optim.SGD([reference], lr=LR, momentum=MOMENTUM)
    state, found = {}, {"steps": []}
    for _ in range(STEPS):
        w = weights.clone().requires_grad_()
        F.mse_loss(x @ w, y).backward()  # this rank's own gradient
        counts = {}
        with wire(counts):
            step(weights, w.grad, state, lr=LR, momentum=MOMENTUM)
        counts.pop("bytes", None)  # the calls are enough here
        reference_optimizer.zero_grad()
        F.mse_loss(x @ reference, y).backward()
        dist.all_reduce(reference.grad)
        reference.grad /= world_size  # the gradient averaged over the ranks
        reference_optimizer.step()
        kept = sum(v.numel() if isinstance(v, torch.Tensor) and v.dim() > 0 else  # a counter
                   len(v) if isinstance(v, (list, tuple)) else 0 for v in state.values())
        found["steps"].append({"gap": (weights - reference.detach()).abs().max().item(),
                               "collectives": counts, "state_values": kept})
    print(f"rank {rank}: largest weight difference "
          f"{max(s['gap'] for s in found['steps']):.1e}, momentum values kept "
          f"{found['steps'][-1]['state_values']}, collectives {found['steps'][-1]['collectives']}",
          flush=True)
    report(args.out, found, size=SIZE)
    teardown()
