"""Lesson 13, section 4: what find_unused_parameters' walk of the graph costs, and how it
meets activation checkpointing.

seconds_per_step times a 32-layer model under plain DDP, find_unused_parameters=True and
static_graph=True; checkpointed trains a checkpointed model with each setting and keeps
the error, if one comes. Rank 0 writes what every rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/graph_walk.py
"""

import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


class Deep(nn.Module):
    """32 small layers: a long autograd graph, little arithmetic."""

    def __init__(self, depth=32, width=32, checkpointed=False, reentrant=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.checkpointed, self.reentrant = checkpointed, reentrant

    def forward(self, x):
        for layer in self.layers:
            if self.checkpointed:  # keep no activations: recompute them in backward
                x = checkpoint(lambda t, f=layer: torch.relu(f(t)), x,
                               use_reentrant=self.reentrant)  # None: as if not passed
            else:
                x = torch.relu(layer(x))
        return x


def seconds_per_step(rank, device, steps, **ddp_kwargs):
    """Seconds of a forward and backward, all parameters used: the fastest of three blocks
    of steps, each timed on the slowest rank."""
    torch.manual_seed(0)
    model = DDP(Deep().to(device), **ddp_kwargs)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank)).to(device)
    model(x).sum().backward()  # the first step is special (buckets; static_graph records)
    blocks = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            model(x).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        blocks.append(elapsed.item() / steps)
    del model
    return min(blocks)


def checkpointed(rank, device, reentrant, **ddp_kwargs):
    """Activation checkpointing under DDP: two steps, and the error if one comes."""
    torch.manual_seed(0)
    model = DDP(Deep(depth=4, checkpointed=True, reentrant=reentrant).to(device), **ddp_kwargs)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank)).to(device)
    x.requires_grad_()  # for this demo only: reentrant checkpointing needs an input that
    # requires grad, or no parameter gets one; use_reentrant=False needs no such line
    found = {"error": None}
    try:
        for _ in range(2):
            model(x).sum().backward()
    except RuntimeError as error:
        found["error"] = str(error)
    del model
    return found


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--timing-steps", type=int, default=10,
                        help="steps per timed block (3 blocks) for each setting")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: it builds a DDP model (lesson 02 says why)
    rank, device, steps = world.rank, world.device, args.timing_steps
    settings = {"plain": {}, "find_unused_parameters": {"find_unused_parameters": True},
                "static_graph": {"static_graph": True}}
    found = {"seconds_per_step": {name: seconds_per_step(rank, device, steps, **kwargs)
                                  for name, kwargs in settings.items()}}
    unused = {"find_unused_parameters": True}
    found["checkpointing"] = {
        "reentrant": checkpointed(rank, device, True),
        "reentrant, find_unused": checkpointed(rank, device, True, **unused),
        "reentrant, find_unused, static_graph": checkpointed(
            rank, device, True, static_graph=True, **unused),
        "non-reentrant, find_unused": checkpointed(rank, device, False, **unused),
        "not said, find_unused": checkpointed(rank, device, None, **unused)}
    with warnings.catch_warnings(record=True) as caught:  # checkpoint's default, asked
        warnings.simplefilter("always")
        checkpoint(torch.relu, torch.ones(1, requires_grad=True))
    found["checkpoint_default"] = [str(w.message) for w in caught]
    report(args.out, found)
    teardown()


if __name__ == "__main__":
    main()
