"""Lesson 05, section 1: a parameter that gets no gradient.

Plain DDP with a branch the forward skips: what step 0 does and the error step 1
raises, without and with the debug level INFO; then the two fixes, find_unused_parameters
and static_graph, and the gradient each gives the skipped branch. Rank 0 writes what
every rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_real_training/unused_parameters.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    """body, then aux only when asked, then head: aux is a branch a step can skip."""

    def __init__(self, width=16):
        super().__init__()
        self.body = nn.Linear(width, width)  # parameters 0 and 1: weight, bias
        self.aux = nn.Linear(width, width)   # parameters 2 and 3
        self.head = nn.Linear(width, 2)      # parameters 4 and 5

    def forward(self, x, use_aux=False):
        h = torch.relu(self.body(x))
        if use_aux:
            h = torch.relu(self.aux(h))
        return self.head(h)


def data(rank, device, n=8, width=16):
    """This rank's own batch, in float64 (a different one on every rank)."""
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, width, generator=g, dtype=torch.float64).to(device)


def skipped_branch(rank, device):
    """Plain DDP, aux never used: two steps of SGD, what step 0 did, and the error."""
    torch.manual_seed(0)
    model = DDP(Net().double().to(device))
    alone = Net().double().to(device)  # the same weights without DDP: this rank's gradient
    alone.load_state_dict(model.module.state_dict())
    alone(data(rank, device)).sum().backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    found = {"error": None}
    try:
        for step in range(2):
            found["step"] = step
            optimizer.zero_grad()
            model(data(rank, device)).sum().backward()  # step 1 raises in the forward
            found["own_gradient"] = all(  # step 0: was anything averaged?
                torch.equal(p.grad, q.grad) for p, q in
                zip(model.module.parameters(), alone.parameters()) if q.grad is not None)
            optimizer.step()
            found["weights"] = torch.cat(
                [p.detach().flatten().cpu() for p in model.parameters()]).tolist()
    except RuntimeError as error:
        found["error"] = str(error)
    del model
    return found


def fixed(rank, world_size, device, **ddp_kwargs):
    """Three steps with a fix. With find_unused_parameters the odd ranks use aux and the
    even ranks do not; with static_graph no rank does (the set must never change)."""
    use_aux = rank % 2 == 1 and "find_unused_parameters" in ddp_kwargs
    torch.manual_seed(0)
    model = DDP(Net().double().to(device), **ddp_kwargs)
    for _ in range(3):
        model.zero_grad()
        model(data(rank, device), use_aux=use_aux).sum().backward()
    alone = Net().double().to(device)  # the same weights, this rank's gradient without DDP
    alone.load_state_dict(model.module.state_dict())
    alone(data(rank, device), use_aux=use_aux).sum().backward()
    mean = alone.aux.weight.grad if use_aux else torch.zeros_like(alone.aux.weight)
    dist.all_reduce(mean)  # the sum over the ranks (zero where aux was not used) ...
    mean /= world_size     # ... divided by all of them, as DDP does
    grad = model.module.aux.weight.grad
    found = {"aux_grad_gap": None if grad is None else (grad - mean).abs().max().item()}
    del model
    return found


@record
def main():
    args = arguments(__doc__).parse_args()  # --device, --out (lesson 02)
    world = setup(args.device, ddp=True)  # ddp=True: it builds a DDP model (lesson 02 says why)
    rank, device = world.rank, world.device
    found = {"plain": skipped_branch(rank, device)}
    dist.set_debug_level(dist.DebugLevel.INFO)  # what TORCH_DISTRIBUTED_DEBUG=INFO sets
    found["plain_info"] = skipped_branch(rank, device)
    dist.set_debug_level(dist.DebugLevel.OFF)
    for fix in ("find_unused_parameters", "static_graph"):
        found[fix] = fixed(rank, world.world_size, device, **{fix: True})
    report(args.out, found)
    teardown()


if __name__ == "__main__":
    main()
