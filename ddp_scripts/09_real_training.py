"""Lesson 09: DDP in real training code.

Three things that go wrong when DDP meets real training code, each provoked and measured
on every rank: parameters that get no gradient (the error, finding them, two fixes and
their cost, activation checkpointing), gradient accumulation with no_sync (the
all-reduces counted), and mixed precision with gradient clipping (bf16 autocast, then
fp16 with a GradScaler). Rank 0 writes what every rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/09_real_training.py
"""

import argparse
import json
import math
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-steps", type=int, default=4,
                        help="micro-batches accumulated into one optimizer step")
    parser.add_argument("--timing-steps", type=int, default=10,
                        help="steps per timed block (3 blocks) for each way of handling "
                        "unused parameters")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON here")
    return parser.parse_args()


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


def weights(model):
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


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
            found["weights"] = weights(model.module).tolist()
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
    x.requires_grad_()  # reentrant checkpointing needs an input that requires grad
    found = {"error": None}
    try:
        for _ in range(2):
            model(x).sum().backward()
    except RuntimeError as error:
        found["error"] = str(error)
    del model
    return found


def unused_parameters(rank, world_size, device, timing_steps):
    found = {"plain": skipped_branch(rank, device)}
    with warnings.catch_warnings(record=True) as caught:  # checkpoint's default, asked
        warnings.simplefilter("always")
        checkpoint(torch.relu, torch.ones(1, requires_grad=True))
    found["checkpoint_default"] = [str(w.message) for w in caught]
    dist.set_debug_level(dist.DebugLevel.INFO)  # what TORCH_DISTRIBUTED_DEBUG=INFO sets
    found["plain_info"] = skipped_branch(rank, device)
    dist.set_debug_level(dist.DebugLevel.OFF)
    found["find_unused_parameters"] = fixed(rank, world_size, device,
                                            find_unused_parameters=True)
    found["static_graph"] = fixed(rank, world_size, device, static_graph=True)
    found["seconds_per_step"] = {
        "plain": seconds_per_step(rank, device, timing_steps),
        "find_unused_parameters": seconds_per_step(rank, device, timing_steps,
                                                   find_unused_parameters=True),
        "static_graph": seconds_per_step(rank, device, timing_steps, static_graph=True)}
    found["checkpointing"] = {
        "reentrant": checkpointed(rank, device, True),
        "reentrant, find_unused": checkpointed(rank, device, True, find_unused_parameters=True),
        "reentrant, find_unused, static_graph": checkpointed(
            rank, device, True, find_unused_parameters=True, static_graph=True),
        "non-reentrant, find_unused": checkpointed(
            rank, device, False, find_unused_parameters=True),
        "not said, find_unused": checkpointed(rank, device, None, find_unused_parameters=True)}
    return found


def mlp(width=16):
    """A small model that uses every parameter in every step."""
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))


def count_allreduces(model):
    """A communication hook (lesson 05) that counts the buckets DDP all-reduces."""
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
    x = data(rank, device, n=micro_steps * batch)
    y = torch.randint(2, (len(x),), generator=torch.Generator().manual_seed(rank)).to(device)
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


def mixed_precision(rank, device, steps=4):
    """bf16 autocast and clipping, then fp16 with a GradScaler (weights stay float32)."""
    x = data(rank, device).float()
    y = torch.randint(2, (len(x),), generator=torch.Generator().manual_seed(rank)).to(device)
    torch.manual_seed(0)
    model = DDP(mlp().to(device))
    full = F.cross_entropy(model(x), y).item()  # float32, for comparison
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)  # after backward
    found = {"bf16": {"output": str(out.dtype), "loss": str(loss.dtype),
                      "grad": str(model.module[0].weight.grad.dtype), "loss_bf16": loss.item(),
                      "loss_fp32": full, "norm": norm.item(),
                      "clipped_norm": gradient(model).norm().item()}}
    del model
    torch.manual_seed(0)
    model = DDP(mlp().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**19)  # the default: 2**16
    found["fp16"] = []
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
        found["fp16"].append({"scale": scale, "stepped": not torch.equal(
            before, model.module[0].weight), "scaled_norm": scaled if math.isfinite(scaled)
            else None, "norm": norm if math.isfinite(norm) else None})
    del model
    return found


@record
def main():
    args = parse_args()
    world = setup(args.device, ddp=True)  # lesson 01; ddp=True: lesson 05, "A clean exit"
    rank, world_size, device = world.rank, world.world_size, world.device
    found = {"rank": rank}
    found["unused"] = unused_parameters(rank, world_size, device, args.timing_steps)
    found["accumulation"] = accumulation(rank, device, args.micro_steps)
    found["mixed_precision"] = mixed_precision(rank, device)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    if rank == 0:
        print(f"{world_size} ranks: unused parameters, accumulation over "
              f"{args.micro_steps} micro-steps and mixed precision done", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "micro_steps": args.micro_steps,
                           "ranks": everyone}, f)
    teardown()


if __name__ == "__main__":
    main()
