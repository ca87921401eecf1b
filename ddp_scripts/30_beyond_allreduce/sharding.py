"""Lesson 30, section 2: sharding the training state with ZeroRedundancyOptimizer and FSDP2.

The same model trained with Adam three ways, DDP, ZeRO (stage 1) and FSDP2 (fully_shard):
the bytes of weights, gradients and optimizer state this rank keeps, the collectives it
calls per step (counted by wire.py), and the final weights, compared with DDP's.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/30_beyond_allreduce/sharding.py
"""

import torch
import torch.nn as nn
from ddp_common import arguments, record, report, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from wire import wire


class Tower(nn.Module):
    """Four layers of 64 x 64 in float64: 16 640 parameters, 133 120 bytes."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def local_bytes(tensors):
    """Bytes this rank holds: a sharded tensor (a DTensor, from FSDP2) counts its own shard."""
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in tensors)


def sharded(way, world, steps=3):
    """Adam on the Tower, one way (DDP, ZeRO or FSDP2): what this rank keeps and sends."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(world.rank),
                    dtype=torch.float64).to(world.device)
    torch.manual_seed(0)
    model = Tower().double().to(world.device)
    if way == "FSDP2":
        mesh = init_device_mesh(world.device.type, (world.world_size,))
        for layer in model.layers:  # each layer its own unit: gathered when it runs
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = DDP(model)
        model.register_comm_hook(None, default_hooks.allreduce_hook)  # seen by the wire
    if way == "ZeRO":  # each rank keeps the Adam state of some of the parameters
        optimizer = ZeroRedundancyOptimizer(model.parameters(),
                                            optimizer_class=torch.optim.Adam, lr=0.01)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counts = {}
    with wire(counts):
        for _ in range(steps):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            grads = local_bytes(p.grad for p in model.parameters())
            optimizer.step()
    state = (optimizer.optim if way == "ZeRO" else optimizer).state.values()
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    found = {"params": local_bytes(model.parameters()), "grads": grads,
             "optimizer": local_bytes(v for s in state for v in s.values() if v.dim() > 0),
             "calls_per_step": {k: v / steps for k, v in counts.items() if k != "bytes"},
             "bytes_per_step": counts.get("bytes", 0) / steps,
             "weights": torch.cat([p.detach().flatten() for p in full]).tolist()}
    del model, optimizer, full
    return found


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: lesson 13, "A clean exit"
    report(args.out, {way: sharded(way, world) for way in ("DDP", "ZeRO", "FSDP2")})
    teardown()


if __name__ == "__main__":
    main()
