"""Lesson 05, section 2: gradient accumulation with no_sync.

One optimizer step's gradient from the same samples, four ways: one big batch; K
micro-batches under no_sync; K micro-batches, each synchronized; no_sync without dividing
the losses by K. A communication hook counts the all-reduces. Rank 0 writes what every
rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_real_training/accumulation.py
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(width=16):
    """A small model that uses every parameter in every step."""
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))


def data(rank, device, n, width=16):
    """This rank's own samples and labels, in float64 (different on every rank)."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(n, width, generator=g, dtype=torch.float64)
    return x.to(device), torch.randint(2, (n,), generator=g).to(device)


def count_allreduces(model):
    """A communication hook that counts the buckets DDP all-reduces (lesson 13 has more)."""
    counter = {"allreduces": 0}

    def hook(state, bucket):
        state["allreduces"] += 1
        return default_hooks.allreduce_hook(None, bucket)  # DDP's own all-reduce
    model.register_comm_hook(counter, hook)
    return counter


def gradient(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def accumulation(rank, device, micro_steps, batch=8):
    """One optimizer step's gradient from the same samples, four ways."""
    x, y = data(rank, device, micro_steps * batch)
    micro = list(zip(x.split(batch), y.split(batch)))
    found = {}
    for way in ("one big batch", "no_sync", "sync every micro-step", "no_sync, no division"):
        torch.manual_seed(0)
        model = DDP(mlp().double().to(device))
        counter = count_allreduces(model)
        if way == "one big batch":
            F.cross_entropy(model(x), y).backward()
        for i, (xb, yb) in enumerate(micro if way != "one big batch" else []):
            divide = 1 if way == "no_sync, no division" else micro_steps
            if way.startswith("no_sync") and i < micro_steps - 1:
                with model.no_sync():  # forward and backward inside: no all-reduce
                    (F.cross_entropy(model(xb), yb) / divide).backward()
                if i == 0 and way == "no_sync":  # one micro-step in: still this rank's own
                    found["local_norm"] = gradient(model).norm().item()
            else:
                (F.cross_entropy(model(xb), yb) / divide).backward()
        found[way] = {"allreduces": counter["allreduces"], "grad": gradient(model).tolist()}
        del model
    found["synced_norm"] = torch.tensor(found["no_sync"]["grad"]).norm().item()
    return found


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--micro-steps", type=int, default=4,
                        help="micro-batches accumulated into one optimizer step")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: it builds a DDP model (lesson 02 says why)
    found = accumulation(world.rank, world.device, args.micro_steps)
    report(args.out, found, micro_steps=args.micro_steps)
    teardown()


if __name__ == "__main__":
    main()
