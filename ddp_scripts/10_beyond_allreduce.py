"""Lesson 10: beyond plain all-reduce: compression hooks, torch.compile, sharding.

Three ways to change what DDP sends or keeps, each measured on every rank: communication
hooks that compress the gradients (fp16, PowerSGD; bytes on the wire counted), DDP under
torch.compile (the graph split at bucket boundaries, the compile time, a failure), and
sharding with ZeroRedundancyOptimizer and FSDP2 (bytes kept per rank, collectives
counted, weights compared with DDP's). Rank 0 writes what every rank found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/10_beyond_allreduce.py
"""

import argparse
import contextlib
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single",
               "all_gather_into_tensor", "reduce_scatter_tensor")


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps per hook")
    parser.add_argument("--backend", default="aot_eager",
                        help="torch.compile backend to time (inductor: slow to compile on CPU)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON here")
    return parser.parse_args()


@contextlib.contextmanager
def wire(counts):
    """Count the calls and the bytes of this rank's collectives while inside. The hooks,
    ZeRO and FSDP call them as attributes of torch.distributed, so replacing those
    attributes for a while sees every call."""
    real = {name: getattr(dist, name) for name in COLLECTIVES}

    def counted(name):
        def call(*args, **kwargs):
            tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            full = max(t.numel() * t.element_size() for t in tensors)  # the whole, not a shard
            counts[name] = counts.get(name, 0) + 1
            counts["bytes"] = counts.get("bytes", 0) + full
            return real[name](*args, **kwargs)
        return call
    for name in COLLECTIVES:
        setattr(dist, name, counted(name))
    try:
        yield counts
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def regression(rank, device, n=64, width=256):
    """This rank's batch of a made-up regression task (8 targets), float32."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(n, width, generator=g)
    w = torch.randn(width, 8, generator=torch.Generator().manual_seed(1000))
    return x.to(device), (x @ w / width**0.5).to(device)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 8))


def with_hook(name, device, steps, rank):
    """Train the MLP with one communication hook; the wire counted after 5 steps."""
    model = DDP(mlp().to(device))
    if name == "allreduce":  # what DDP does anyway, as a Python hook so the wire sees it
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "powerSGD":
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2)  # plain all-reduce before
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = regression(rank, device)
    counts, losses = {}, []
    start = time.perf_counter()
    for step in range(steps):
        with wire(counts) if step >= 5 else contextlib.nullcontext():
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    found = {"bytes_per_step": counts["bytes"] / (steps - 5),
             "calls_per_step": sum(v for k, v in counts.items() if k != "bytes") / (steps - 5),
             "seconds_per_step": (time.perf_counter() - start) / steps,
             "first_loss": losses[0], "last_loss": losses[-1]}
    del model, optimizer
    return found


def hooks(rank, device, steps):
    found = {name: with_hook(name, device, steps, rank)
             for name in ("allreduce", "fp16", "powerSGD")}
    found["parameters"] = sum(p.numel() for p in mlp().parameters())
    model = DDP(mlp().to(device))
    try:
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        found["bf16_error"] = None
    except TypeError as error:  # refused when the hook is registered
        found["bf16_error"] = str(error)
    found["cuda_build"] = torch.version.cuda is not None or torch.version.hip is not None
    del model
    found["grad_storages"] = {}
    for as_view in (False, True):
        model = DDP(mlp().to(device), gradient_as_bucket_view=as_view)
        x, y = regression(rank, device)
        F.mse_loss(model(x), y).backward()
        storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
        found["grad_storages"][str(as_view)] = len(storages)
        del model
    return found


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


def sharded(rank, world_size, device, steps=3):
    """Adam on the same model three ways: DDP, ZeRO, FSDP2. What each rank keeps."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank),
                    dtype=torch.float64).to(device)
    found = {}
    for way in ("DDP", "ZeRO", "FSDP2"):
        torch.manual_seed(0)
        model = Tower().double().to(device)
        if way == "FSDP2":
            mesh = init_device_mesh(device.type, (world_size,))
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
        found[way] = {
            "params": local_bytes(model.parameters()), "grads": grads,
            "optimizer": local_bytes(v for s in state for v in s.values() if v.dim() > 0),
            "calls_per_step": {k: v / steps for k, v in counts.items() if k != "bytes"},
            "bytes_per_step": counts.get("bytes", 0) / steps,
            "weights": torch.cat([p.detach().flatten() for p in full]).tolist()}
        del model, optimizer, full
    return found


class Stack(nn.Module):
    """Four layers of 512 x 512: 1 MiB of float32 weights each."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def compiled(rank, device, backend):
    """torch.compile on a DDP model: graphs, equality, compile time, a failure."""
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(rank)).to(device)
    graphs = []

    def counting(graph_module, example_inputs):  # a backend: note each graph, run it as is
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward

    def build(make, inside=False, **ddp_kwargs):
        torch.compiler.reset()  # forget what earlier compiles cached
        graphs.clear()
        torch.manual_seed(0)
        inner = make().to(device)
        if inside:  # compile the inner model, then wrap it: DDP calls the compiled model
            inner = torch.compile(inner, backend=counting)
        return DDP(inner, **ddp_kwargs)

    def sequential():  # the same layers as Stack, in torch's own container
        return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())))

    found = {}
    for name, make in (("compile(DDP(Stack))", Stack), ("compile(DDP(Sequential))", sequential),
                       ("DDP(compile(Sequential))", sequential)):
        eager = build(make, bucket_cap_mb=1)
        model = build(make, inside=name.startswith("DDP"), bucket_cap_mb=1)
        out = (model if name.startswith("DDP") else torch.compile(model, backend=counting))(x)
        out.sum().backward()
        reference = eager(x)
        reference.sum().backward()
        found[name] = {"graphs": len(graphs), "output_gap": (out - reference).abs().max().item(),
                       "grad_gap": max((p.grad - q.grad).abs().max().item() for p, q in
                                       zip(model.parameters(), eager.parameters()))}
        del model, eager
    model = build(Stack, bucket_cap_mb=1)
    run = torch.compile(model, backend=backend)
    seconds = []
    for _ in range(6):
        start = time.perf_counter()
        run(x).sum().backward()
        seconds.append(time.perf_counter() - start)
    found["timing"] = {"backend": backend, "first": seconds[0], "later": min(seconds[1:])}
    del model, run
    model = build(Stack, bucket_cap_mb=0.5)  # under the 1 MiB DDPOptimizer assumes at first
    try:
        torch.compile(model, backend=counting)(x)
        found["small_buckets_error"] = None
    except Exception as error:  # noqa: BLE001  whatever dynamo raises, kept for the lesson
        found["small_buckets_error"] = f"{type(error).__name__}: {error}"
    del model
    return found


@record
def main():
    args = parse_args()
    world = setup(args.device, ddp=True)  # lesson 01; ddp=True: lesson 05, "A clean exit"
    rank, world_size, device = world.rank, world.world_size, world.device
    found = {"rank": rank}
    found["hooks"] = hooks(rank, device, args.steps)
    found["sharding"] = sharded(rank, world_size, device)
    found["compile"] = compiled(rank, device, args.backend)  # last: its failure on purpose
    everyone = [None] * world_size
    dist.all_gather_object(everyone, found)
    if rank == 0:
        print(f"{world_size} ranks: hooks, sharding and torch.compile done", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "ranks": everyone}, f)
    teardown()


if __name__ == "__main__":
    main()
