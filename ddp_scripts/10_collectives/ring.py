"""Lesson 10: ring all-reduce by hand, compared with dist.all_reduce on the first k ranks
for each k in --ring-world-sizes: for correctness, for what each rank sends (its own
count, and the bytes the Linux kernel saw it write), and for time.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/10_collectives/ring.py \\
        --ring-world-sizes 2 4
"""

import sys
import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown, write_json


def ring_all_reduce(t, group=None):
    """Sum the contiguous tensor `t` over the ranks of `group`, in place, with point-to-point
    messages only; return the number of elements this rank sent. The groups used here are
    the first n ranks, so a rank's number in the group is also its global rank."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = torch.tensor_split(t.view(-1), n)  # views into t: writing a chunk writes t
    spare = [torch.empty_like(chunks[0]) for _ in range(2)]  # the largest chunk, twice
    # The whole schedule, one entry per step: phase 1 (reduce-scatter) receives into a
    # spare buffer and adds it; phase 2 (all-gather) receives straight into place.
    sends = ([chunks[(rank - step) % n] for step in range(n - 1)]
             + [chunks[(rank - step + 1) % n] for step in range(n - 1)])
    receives = ([spare[step % 2][:chunks[(rank - step - 1) % n].numel()]
                 for step in range(n - 1)]
                + [chunks[(rank - step) % n] for step in range(n - 1)])
    gloo = dist.get_backend(group) == "gloo"
    receiving = dist.irecv(receives[0], left, group) if gloo else None
    sent = 0
    for i in range(2 * (n - 1)):
        if gloo:  # post the next step's receive before waiting on this one
            upcoming = dist.irecv(receives[i + 1], left, group) if i + 1 < len(receives) else None
            requests = [dist.isend(sends[i], right, group), receiving]
        else:  # NCCL: a step's send and receive must start together, in one batch
            upcoming, requests = None, dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, sends[i], right, group),
                 dist.P2POp(dist.irecv, receives[i], left, group)])
        for request in requests:
            request.wait()
        if i < n - 1:
            chunks[(rank - i - 1) % n].add_(receives[i])  # phase 1: add into t
        sent += sends[i].numel()
        receiving = upcoming
    return sent


def check_ring(sizes, device, group):
    """The ring against dist.all_reduce on random integers (exact sums): equal or not."""
    checks = []
    for size in sizes:
        generator = torch.Generator().manual_seed(1000 * dist.get_rank() + size)
        ours = torch.randint(-100, 100, (size,), generator=generator).to(device)
        theirs = ours.clone()
        ring_all_reduce(ours, group)
        dist.all_reduce(theirs, group=group)
        checks.append({"size": size, "equal": torch.equal(ours, theirs)})
    return checks


def bytes_written():
    """Bytes this process has written to files and sockets so far, as the Linux kernel
    counts them (wchar in /proc/self/io, all threads); None where there is no such file."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None


def ring_against_all_reduce(numel, repeats, device, group):
    """Both methods on `numel` float32 values, repeats + 1 times (the first round warms up):
    the elements the ring sent, the bytes the kernel saw this process write during each
    (Gloo sends through TCP sockets, even on one machine; NCCL's paths are not counted),
    and the median seconds of each."""
    counted = dist.get_backend() == "gloo" and bytes_written() is not None
    traffic, times = {}, {"ring": [], "all_reduce": []}
    for _ in range(repeats + 1):
        for method in times:
            work = torch.ones(numel, device=device)
            dist.barrier(group=group)  # its own messages are written before the count
            written, start = bytes_written(), time.perf_counter()
            if method == "ring":
                traffic["elements_sent"] = ring_all_reduce(work, group)
            else:
                dist.all_reduce(work, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize()  # CUDA calls return before the GPU has finished
            times[method].append(time.perf_counter() - start)
            traffic[f"{method}_bytes"] = bytes_written() - written if counted else None
    return traffic, {method: sorted(t[1:])[repeats // 2] for method, t in times.items()}


@record  # on failure, torchrun's report shows this rank's traceback (lesson 01)
def main():
    parser = arguments(__doc__)
    parser.add_argument("--ring-world-sizes", type=int, nargs="+",
                        help="run the ring on the first k ranks for each k (default: all)")
    parser.add_argument("--ring-sizes", type=int, nargs="+", default=[1, 7, 1001],
                        help="tensor sizes for the check against dist.all_reduce")
    parser.add_argument("--timing-numel", type=int, default=1 << 20,
                        help="float32 elements counted and timed (default 1 Mi, 4 MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each method")
    args = parser.parse_args()
    world = setup(args.device)  # lesson 02: checks, device, process group
    ring_world_sizes = args.ring_world_sizes or [world.world_size]
    if not all(2 <= k <= world.world_size for k in ring_world_sizes):
        sys.exit(f"--ring-world-sizes must lie between 2 and {world.world_size}")
    rings = []
    for k in ring_world_sizes:  # the first k ranks; every rank calls new_group
        group = dist.new_group(list(range(k))) if k < world.world_size else None
        mine = None
        if world.rank < k:
            checks = check_ring(args.ring_sizes, world.device, group)
            traffic, seconds = ring_against_all_reduce(args.timing_numel, args.repeats,
                                                       world.device, group)
            mine = {"checks": checks, "traffic": traffic, "seconds": seconds}
        members = report(None, mine)[:k]  # gathered on every rank; written below
        counted = members[0]["traffic"]["ring_bytes"] is not None
        counted_by = "/proc/self/io wchar" if counted else None
        rings.append({"world_size": k, "ring_checks": members[0]["checks"],
                      "timing": {"seconds": members[0]["seconds"]},  # rank 0's
                      "traffic": {"bytes_counted_by": counted_by,
                                  "ranks": [member["traffic"] for member in members]}})
    if world.rank == 0 and args.out:
        write_json(args.out, {"world_size": world.world_size, "backend": dist.get_backend(),
                              "numel": args.timing_numel, "repeats": args.repeats,
                              "rings": rings})
    teardown()


if __name__ == "__main__":
    main()
