"""Lesson 21, exercise 4: the DDP run whose training loop uneven_exercise.py writes. Not a
script of its own: the exercise calls run_exercise(train). Every rank has MOST batches
except the last, which has LAST; rank 0 writes what each rank found as JSON. CPU and Gloo on
any machine."""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).double()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)  # the same in every process
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True)


def reference(counts):
    """Step s: the gradients of the ranks with an s-th batch, summed, / the world size."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(max(counts)):
        optimizer.zero_grad()
        have = [batch(step, r) for r, n in enumerate(counts) if step < n]
        (sum(F.mse_loss(model(x), y) for x, y in have) / len(counts)).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@record
def run_exercise(train):
    parser = arguments(sys.modules["__main__"].__doc__)  # --device (unused here), --out
    parser.add_argument("--batches", type=int, nargs=2, default=[4, 2], metavar=("MOST", "LAST"))
    parser.add_argument("--timeout", type=float, default=10,
                        help="seconds a collective waits, then Gloo gives up")
    args = parser.parse_args()
    rank, _, n, _ = setup("cpu", timeout_s=args.timeout, ddp=True)  # lessons 02, 13
    counts = [args.batches[0]] * (n - 1) + [args.batches[1]]
    ddp = DDP(make_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = []  # one entry per optimizer step
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    train(ddp, optimizer, (batch(step, rank) for step in range(counts[rank])))
    dist.barrier()  # every rank has left train()
    weights = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    found = {"optimizer_steps": len(steps), "weights": weights.tolist(),
             "matches_reference": torch.allclose(weights, reference(counts),
                                                 rtol=1e-12, atol=1e-15)}
    report(args.out, found, counts=counts)  # rank 0 writes every rank's, as JSON
    del ddp  # the model goes before the group: lesson 13, "A clean exit"
    teardown()
