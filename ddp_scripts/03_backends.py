"""Lesson 03: what the backend offers and delivers: every operation and every ReduceOp
probed, then all_reduce time and bandwidth by size.

Each rank first tries every operation once, and all_reduce with every ReduceOp on
float32 and int64 tensors, to record which ones this backend accepts on this device.
Then, for each message size, every rank times a series of all_reduce calls; the
slowest rank's time counts (a collective ends when its last rank is done). From the
time t for S bytes on n ranks, as NVIDIA's nccl-tests define them:
    algorithm bandwidth  algbw = S / t
    bus bandwidth        busbw = algbw * 2(n-1)/n   (a normalisation for comparing with
                                                     hardware peak, not a per-link measurement)
Rank 0 also times a plain memory copy of each size in its own memory, and compares
all-reducing many small tensors one by one against one bucket of the same total size.
With --ddp-buckets, the script also notes the gradient buckets DDP makes with and
without bucket_cap_mb. With --out, rank 0 writes it all as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/03_backends.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from ddp_common import pick_device, record, require_torchrun, setup, teardown
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

KIB = 1024
DEFAULT_SIZES = [KIB * 4 ** k for k in range(9)]  # 1 KiB ... 64 MiB
REDUCE_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES,
                        help="message sizes in bytes (float32, so multiples of 4)")
    parser.add_argument("--seconds-per-size", type=float, default=0.15,
                        help="about how long to spend timing each size")
    parser.add_argument("--backend", default="auto",
                        help="auto (from the device), gloo, nccl, mpi, or a per-device "
                             "list such as cpu:gloo,cuda:nccl")
    parser.add_argument("--ddp-buckets", action="store_true",
                        help="also note DDP's bucket sizes with bucket_cap_mb None and 25 "
                             "(takes seconds: a process's first DDP imports torch._dynamo)")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def check_backend(backend):
    """Refuse, with the list of what is there, a backend this PyTorch was built without."""
    names = [part.split(":")[-1] for part in backend.split(",")]
    missing = [name for name in names if not dist.is_backend_available(name)]
    if missing:
        have = [name for name in ("gloo", "nccl", "mpi", "ucc") if dist.is_backend_available(name)]
        sys.exit(f"backend {', '.join(missing)} is not available in this PyTorch build "
                 f"(available: {', '.join(have)})")


def probe_operations(device):
    """Try each operation once on this backend and device: {name: "ok" or the error}."""
    rank, n = dist.get_rank(), dist.get_world_size()

    def t(*values):
        return torch.tensor(values, dtype=torch.float32, device=device)

    operations = {
        "send/recv": lambda: (dist.send(t(1.0), dst=1) if rank == 0
                              else dist.recv(t(0.0), src=0) if rank == 1 else None),
        "broadcast": lambda: dist.broadcast(t(1.0), src=0),
        "all_reduce": lambda: dist.all_reduce(t(1.0)),
        "reduce": lambda: dist.reduce(t(1.0), dst=0),
        "all_gather": lambda: dist.all_gather([t(0.0) for _ in range(n)], t(1.0)),
        "gather": lambda: dist.gather(t(1.0), [t(0.0) for _ in range(n)] if rank == 0 else None,
                                      dst=0),
        "scatter": lambda: dist.scatter(t(0.0), [t(1.0) for _ in range(n)] if rank == 0
                                        else None, src=0),
        "reduce_scatter": lambda: dist.reduce_scatter(t(0.0), [t(1.0) for _ in range(n)]),
        "all_to_all": lambda: dist.all_to_all([t(0.0) for _ in range(n)],
                                              [t(1.0) for _ in range(n)]),
        "barrier": lambda: dist.barrier(),
    }
    found = {}
    for name, operation in operations.items():
        try:
            operation()
            found[name] = "ok"
        except RuntimeError as error:  # the backend refused it for this device
            found[name] = str(error).splitlines()[0][:120]
    return found


def probe_reduce_ops(device):
    """all_reduce of rank + 1 with each ReduceOp, on float32 and on int64 (the bitwise
    ops need integers): {op: {dtype: {"ok": True, "result": x} or {"ok": False, "error": ...}}}."""
    rank = dist.get_rank()
    found = {}
    for name in REDUCE_OPS:
        op = getattr(dist.ReduceOp, name)
        if name == "PREMUL_SUM":  # multiplies by a factor before summing: built with one
            op = dist._make_nccl_premul_sum(0.5)  # also ReduceOp.PREMUL_SUM(0.5) on 2.13
        found[name] = {}
        for dtype in (torch.float32, torch.int64):
            t = torch.tensor([rank + 1], dtype=dtype, device=device)
            try:
                dist.all_reduce(t, op=op)
                outcome = {"ok": True, "result": t.item()}
            except (RuntimeError, TypeError, ValueError) as error:  # refused: same on every rank
                outcome = {"ok": False, "error": str(error).splitlines()[0][:120]}
            found[name][str(dtype).removeprefix("torch.")] = outcome
    return found


def average_by_sum(device):
    """The mean of rank + 1 over the ranks, on a backend without ReduceOp.AVG."""
    t = torch.tensor([dist.get_rank() + 1.0], device=device)
    t /= dist.get_world_size()  # divide first...
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # ...then sum: every backend has SUM
    return t.item()


def ddp_bucket_sizes(bucket_cap_mb, device):
    """Bytes per gradient bucket, in the order DDP all-reduced them in its second step,
    for a model of 8 layers of 257 KiB of parameters each (2 MiB in all)."""
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).to(device)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    sizes = []

    def note_then_all_reduce(process_group, bucket):  # a communication hook (lesson 05)
        sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(process_group, bucket)  # what DDP does without a hook

    ddp.register_comm_hook(None, note_then_all_reduce)
    for _ in range(2):  # DDP rebuilds its buckets after the first step (lesson 05)
        sizes.clear()
        ddp(torch.randn(4, 256, device=device)).sum().backward()
    return sizes


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # CUDA calls return before the GPU has finished


def time_all_reduce(numel, seconds, device):
    """Seconds per all_reduce of `numel` float32 values, as the slowest rank saw it."""
    t = torch.ones(numel, device=device)
    dist.all_reduce(t)  # warm up: connections, buffers
    start = time.perf_counter()
    dist.all_reduce(t)
    sync(device)
    once = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(once, op=dist.ReduceOp.MAX)  # every rank runs the same count
    iterations = max(3, min(200, int(seconds / max(once.item(), 1e-6))))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(t)
    sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64,
                           device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item(), iterations


def time_copy(numel, seconds, device):
    """Seconds per copy of `numel` float32 values within one process."""
    src, dst = torch.ones(numel, device=device), torch.empty(numel, device=device)
    dst.copy_(src)
    iterations, start = 0, time.perf_counter()
    while iterations < 3 or time.perf_counter() - start < seconds / 2:
        dst.copy_(src)
        iterations += 1
    sync(device)
    return (time.perf_counter() - start) / iterations


def compare_bucketing(count, numel, device):
    """all_reduce `count` tensors one call each, against one flat tensor of the same size."""
    tensors = [torch.ones(numel, device=device) for _ in range(count)]
    bucket = torch.ones(count * numel, device=device)
    timings = {}
    for name in ("one call per tensor", "one bucket", "one call per tensor", "one bucket"):
        dist.barrier()
        start = time.perf_counter()
        if name == "one bucket":
            dist.all_reduce(bucket)
        else:
            for t in tensors:
                dist.all_reduce(t)
        sync(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64,
                               device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
        timings[name] = elapsed.item()  # the second round (warm) is the one kept
    return timings


@record  # on failure, torchrun's report carries this rank's traceback (lesson 00)
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if world_size < 2:
        sys.exit("this script measures messages between ranks: start at least 2 processes")

    device = pick_device()  # lesson 01
    backend = dist.get_default_backend_for_device(device) if args.backend == "auto" \
        else args.backend
    check_backend(backend)
    setup(device.type, backend, ddp=args.ddp_buckets)  # the group; ddp: lesson 05

    supported = probe_operations(device)
    reduce_ops = probe_reduce_ops(device)
    averaged = average_by_sum(device)
    buckets = None
    if args.ddp_buckets:
        buckets = {"None": ddp_bucket_sizes(None, device), "25": ddp_bucket_sizes(25, device)}
    rows = []
    for size in args.sizes:
        numel = size // 4
        seconds, iterations = time_all_reduce(numel, args.seconds_per_size, device)
        algbw = size / seconds
        busbw = algbw * 2 * (world_size - 1) / world_size
        row = {"bytes": size, "seconds": seconds, "iterations": iterations,
               "algbw": algbw, "busbw": busbw}
        if is_rank0:
            row["copy_bandwidth"] = size / time_copy(numel, args.seconds_per_size, device)
            print(f"{size:>10} B  {seconds * 1e6:10.1f} us  algbw {algbw / 1e9:6.3f} GB/s  "
                  f"busbw {busbw / 1e9:6.3f} GB/s  copy {row['copy_bandwidth'] / 1e9:6.2f} GB/s")
        rows.append(row)
    bucketing = compare_bucketing(count=256, numel=1024, device=device)  # 256 x 4 KiB

    if is_rank0:
        print(f"256 tensors of 4 KiB: {bucketing}")
        if args.out:
            knobs = {name: os.environ.get(name) for name in
                     ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG",
                      "NCCL_SOCKET_IFNAME")}
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "backend": dist.get_backend(),
                           "device": str(device), "supported": supported,
                           "reduce_ops": reduce_ops, "average_by_sum": averaged,
                           "ddp_buckets": buckets, "rows": rows, "bucketing": bucketing,
                           "threads": torch.get_num_threads(),  # what the copy could use
                           "environment": knobs}, f, indent=1)
    teardown()


if __name__ == "__main__":
    main()
