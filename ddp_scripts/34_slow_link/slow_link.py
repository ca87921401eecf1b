"""Lesson 34: DDP on a slow link. Measures the link (a timed all-reduce, and the bytes this
host's network interface sent, from /proc/net/dev), then times DDP training steps of an
MLP of 6.3 MB of gradients under three communication hooks: DDP's own all-reduce,
fp16_compress_hook and PowerSGD (matrix-approximation rank 1).

    torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=nodeA:29500 \\
        --rdzv-id=job1 ddp_scripts/34_slow_link/slow_link.py     # the same on every node
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP


def sent_bytes(interface):
    """The bytes `interface` has sent since it came up (None where this host has none):
    /proc/net/dev lists the interfaces of this process's own network namespace."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == interface:
                return int(counters.split()[8])  # 8 received counters, then sent bytes
    return None


def finish(device):
    """Wait for the GPU's queued work (CUDA runs asynchronously); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_link(device, interface, megabytes):
    """One timed all-reduce of `megabytes` MB of float32: seconds, and bytes sent."""
    data = torch.ones(megabytes * 250_000, device=device)
    dist.all_reduce(data[:1000])  # the connections are open before the clock starts
    finish(device)
    dist.barrier()
    before, start = sent_bytes(interface), time.perf_counter()
    dist.all_reduce(data)
    finish(device)
    seconds = time.perf_counter() - start
    dist.barrier()  # the other rank has received it all: every byte has left this host
    after = sent_bytes(interface)
    return {"tensor_bytes": data.numel() * 4, "seconds": seconds,
            "sent": None if before is None else after - before}


def regression(rank, device, width=512, hidden=1024):
    """This rank's 64 points of a made-up task; an MLP of 1 583 112 parameters (6.3 MB)."""
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(rank))
    w = torch.randn(width, 8, generator=torch.Generator().manual_seed(1000))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                        nn.ReLU(), nn.Linear(hidden, 8))
    return x.to(device), (x @ w / width**0.5).to(device), mlp.to(device)


def register(model, hook):
    """DDP's own all-reduce (no hook), fp16_compress_hook, or PowerSGD with matrix-approximation
    rank 1 (unrelated to process ranks)."""
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powerSGD":
        # Plain all-reduce for steps 0 and 1. PowerSGD keeps state shaped by the buckets (error
        # feedback, warm start), and DDP rebuilds its buckets after step 0: PowerSGDState
        # refuses a start_powerSGD_iter below 2 while either is on (both are by default).
        state = powerSGD.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD.powerSGD_hook)


def timed_steps(hook, world, interface, warmup, steps):
    """Train with one hook: `warmup` steps, then `steps` timed ones, with the bytes sent.
    Before each step, the same forward and backward under no_sync (lesson 05), which
    sends nothing and changes no weight: the compute alone, timed under the same load."""
    x, y, mlp = regression(world.rank, world.device)
    # Passing bucket_cap_mb at all, even the default 25, turns off DDP's small first
    # bucket (1 MiB): all 6.3 MB of gradients form one bucket.
    model = DDP(mlp, bucket_cap_mb=25)
    register(model, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    losses, compute, total = [], 0.0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            finish(world.device)
            dist.barrier()
            before, compute, total = sent_bytes(interface), 0.0, 0.0
        start = time.perf_counter()
        with model.no_sync():  # the gradients stay local: compute only
            F.mse_loss(model(x), y).backward()
        finish(world.device)
        compute += time.perf_counter() - start
        optimizer.zero_grad()  # drop the no_sync gradients
        start = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # returns once the gradients are averaged
        optimizer.step()
        finish(world.device)
        total += time.perf_counter() - start
        losses.append(loss.item())
    dist.barrier()  # as in probe_link: the last step's bytes have all left this host
    after = sent_bytes(interface)
    # A private method, used only to read the buckets' sizes in bytes. "bucket_sizes" is the
    # construction's single bucket; "rebuilt_bucket_sizes" the buckets rebuilt at step 1's
    # forward, in backward's order and with bucket_cap_mb (absent if they never were).
    rebuilt = model._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")
    buckets = [int(size) for size in rebuilt.split(",") if size.strip()]
    del model, optimizer
    return {"seconds_per_step": total / steps, "compute_per_step": compute / steps,
            "losses": losses, "buckets": buckets,
            "sent_per_step": None if before is None else (after - before) / steps}


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--hooks", default="allreduce,fp16,powerSGD")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per hook")
    parser.add_argument("--probe-mb", type=int, default=4, help="MB all-reduced to time the link")
    args = parser.parse_args()
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "eth0")
    world = setup(args.device, ddp=True)
    found = {"host": os.uname().nodename, "interface": interface,
             "probe": probe_link(world.device, interface, args.probe_mb)}
    for hook in args.hooks.split(","):
        found[hook] = timed_steps(hook, world, interface, args.warmup, args.steps)
    found["parameters"] = sum(p.numel() for p in regression(0, "cpu")[2].parameters())
    report(args.out, found)
    teardown()


if __name__ == "__main__":
    main()
