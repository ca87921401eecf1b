"""Lesson 11: all_reduce time and bandwidth against message size, from 1 KiB to 64 MiB.

For each message size, every rank times a series of all_reduce calls; the slowest rank's
time counts (a collective ends when its last rank is done). From the time t for S bytes
on n ranks, as NVIDIA's nccl-tests define them:
    algorithm bandwidth  algbw = S / t
    bus bandwidth        busbw = algbw * 2(n-1)/n   (a normalisation for comparing with
                                                     hardware peak, not a per-link measurement)
Rank 0 also times a plain memory copy of each size in its own memory. With --out, rank 0
writes it all as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/11_backends/bandwidth.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown, write_json

KIB = 1024
DEFAULT_SIZES = [KIB * 4 ** k for k in range(9)]  # 1 KiB ... 64 MiB


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


@record  # on failure, torchrun's report carries this rank's traceback (lesson 01)
def main():
    parser = arguments(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES,
                        help="message sizes in bytes (float32, so multiples of 4)")
    parser.add_argument("--seconds-per-size", type=float, default=0.15,
                        help="about how long to spend timing each size")
    args = parser.parse_args()
    world = setup(args.device)  # the device's backend (lesson 02)
    n = world.world_size
    if n < 2:
        sys.exit("this script measures messages between ranks: start at least 2 processes")
    rows = []
    for size in args.sizes:
        seconds, iterations = time_all_reduce(size // 4, args.seconds_per_size, world.device)
        row = {"bytes": size, "seconds": seconds, "iterations": iterations,
               "algbw": size / seconds, "busbw": size / seconds * 2 * (n - 1) / n}
        if world.rank == 0:
            copy = time_copy(size // 4, args.seconds_per_size, world.device)
            row["copy_bandwidth"] = size / copy
            print(f"{size:>10} B  {seconds * 1e6:10.1f} us  algbw {row['algbw'] / 1e9:6.3f} GB/s"
                  f"  busbw {row['busbw'] / 1e9:6.3f} GB/s  copy {size / copy / 1e9:6.2f} GB/s")
        rows.append(row)
    if world.rank == 0 and args.out:
        knobs = {name: os.environ.get(name) for name in
                 ("OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME")}
        write_json(args.out, {"world_size": n, "backend": dist.get_backend(),
                              "device": str(world.device), "rows": rows,
                              "threads": torch.get_num_threads(),  # what the copy could use
                              "environment": knobs})
    teardown()


if __name__ == "__main__":
    main()
