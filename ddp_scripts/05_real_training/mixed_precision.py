"""Lesson 05, section 3: mixed precision and gradient clipping under DDP.

bf16 autocast with clipping (the dtypes, the loss against float32, the norms), then
float16 with a GradScaler whose scale starts high enough to overflow. The weights stay
float32. Rank 0 writes what every rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_real_training/mixed_precision.py
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(width=16):
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))


def gradient(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def bf16(x, y, device):
    """One bf16 step's dtypes, its loss against float32's, and clipping after backward."""
    torch.manual_seed(0)
    model = DDP(mlp().to(device))
    full = F.cross_entropy(model(x), y).item()  # float32, for comparison
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)  # after backward
    found = {"output": str(out.dtype), "loss": str(loss.dtype),
             "grad": str(model.module[0].weight.grad.dtype), "loss_bf16": loss.item(),
             "loss_fp32": full, "norm": norm.item(),
             "clipped_norm": gradient(model).norm().item()}
    del model
    return found


def fp16(x, y, device, steps=4):
    """float16 steps with a GradScaler: its scale, whether each step ran, the norms."""
    torch.manual_seed(0)
    model = DDP(mlp().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**19)  # the default: 2**16
    found = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()  # the gradients of scale * loss, averaged by DDP
        scaled = gradient(model).norm().item()
        scaler.unscale_(optimizer)  # divides them by the scale, looks for inf and nan
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0).item()
        before, scale = model.module[0].weight.detach().clone(), scaler.get_scale()
        scaler.step(optimizer)  # skipped when a gradient was inf or nan
        scaler.update()  # halves the scale after a skipped step
        found.append({"scale": scale, "stepped": not torch.equal(before, model.module[0].weight),
                      "scaled_norm": scaled if math.isfinite(scaled) else None,
                      "norm": norm if math.isfinite(norm) else None})
    del model
    return found


@record
def main():
    args = arguments(__doc__).parse_args()  # --device, --out (lesson 02)
    world = setup(args.device, ddp=True)  # ddp=True: it builds a DDP model (lesson 02 says why)
    g = torch.Generator().manual_seed(world.rank)  # this rank's own batch
    x = torch.randn(8, 16, generator=g).to(world.device)
    y = torch.randint(2, (8,), generator=g).to(world.device)
    report(args.out, {"bf16": bf16(x, y, world.device), "fp16": fp16(x, y, world.device)})
    teardown()


if __name__ == "__main__":
    main()
