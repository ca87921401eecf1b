"""Lesson 02: point-to-point messages, every collective, and a ring all-reduce by hand.

Every rank starts each operation from a small tensor whose values tell where they came
from (rank r holds r+1, or 10*r + i), records what it held before and after, and rank 0
writes all of it as JSON. Then the hand-written ring all-reduce is compared with
dist.all_reduce, on the first k ranks for each k in --ring-world-sizes: for correctness,
for what each rank sends (its own count, and the bytes the Linux kernel saw it write),
and for time.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/02_collectives.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from ddp_common import record, require_torchrun, setup, teardown


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring-world-sizes", type=int, nargs="+",
                        help="run the ring on the first k ranks for each k (default: all)")
    parser.add_argument("--ring-sizes", type=int, nargs="+", default=[1, 7, 1001],
                        help="tensor sizes for the ring all-reduce check (any size works)")
    parser.add_argument("--timing-numel", type=int, default=1 << 20,
                        help="float32 elements in the counted and timed all-reduce "
                             "(default 1 Mi, 4 MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each method")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def point_to_point(rank, n, device, keep):
    """send/recv, a receive into a longer tensor, and a ring of isend/irecv."""
    # send / recv: rank 0 sends to rank 1; the others take no part.
    t = torch.tensor([10.0 * rank, 10.0 * rank + 1], device=device)
    before = t.tolist()
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    keep("send/recv", before, t.tolist())

    # The same two values received into a longer tensor (filled with -1): a size mismatch
    # that Gloo lets through (torch 2.13). Gloo only: other backends were not tried.
    if dist.get_backend() == "gloo":
        longer = torch.full((3,), -1.0, device=device)
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(longer, src=0)
        keep("recv into a longer tensor", t.tolist() if rank == 0 else None,
             longer.tolist() if rank == 1 else None)

    # isend / irecv: a ring, every rank sends to its right and receives from its left.
    # batch_isend_irecv starts both at once (as one group of operations on NCCL), so
    # nobody blocks the others.
    mine = torch.tensor([rank + 1.0], device=device)
    from_left = torch.zeros(1, device=device)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, (rank + 1) % n),
                                       dist.P2POp(dist.irecv, from_left, (rank - 1) % n)])
    for request in requests:
        request.wait()
    keep("isend/irecv", mine.tolist(), from_left.tolist())


def collectives(rank, n, device, keep):
    """Every collective once, on tensors whose values say which rank they came from."""
    t = torch.tensor([rank + 1.0], device=device)
    before = t.tolist()
    dist.broadcast(t, src=0)  # everyone gets rank 0's tensor
    keep("broadcast", before, t.tolist())

    t = torch.tensor([rank + 1.0], device=device)
    before = t.tolist()
    dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)  # only rank 0's result is defined
    keep("reduce", before, t.tolist() if rank == 0 else None)

    t = torch.tensor([rank + 1.0], device=device)
    before = t.tolist()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # everyone gets the sum
    keep("all_reduce", before, t.tolist())

    t = torch.tensor([rank + 1.0], device=device)
    gathered = [torch.zeros(1, device=device) for _ in range(n)]
    dist.all_gather(gathered, t)  # everyone gets everyone's tensor, in rank order
    keep("all_gather", t.tolist(), [g.item() for g in gathered])

    t = torch.tensor([rank + 1.0], device=device)
    gathered = [torch.zeros(1, device=device) for _ in range(n)] if rank == 0 else None
    dist.gather(t, gather_list=gathered, dst=0)  # only rank 0 receives
    keep("gather", t.tolist(), [g.item() for g in gathered] if rank == 0 else None)

    t = torch.zeros(1, device=device)
    pieces = [torch.tensor([10.0 * i], device=device) for i in range(n)] if rank == 0 else None
    dist.scatter(t, scatter_list=pieces, src=0)  # piece i goes to rank i
    keep("scatter", [p.item() for p in pieces] if rank == 0 else None, t.tolist())

    t = torch.tensor([10.0 * rank + i for i in range(n)], device=device)
    out = torch.zeros(1, device=device)
    dist.reduce_scatter(out, list(t.chunk(n)))  # element i summed over ranks -> rank i
    keep("reduce_scatter", t.tolist(), out.tolist())

    # barrier: rank r arrives r * 0.2 s late; nobody leaves before the last arrives.
    # (time.time() is comparable between processes of one machine, not across nodes.)
    time.sleep(0.2 * rank)
    arrived = time.time()
    dist.barrier()
    keep("barrier", arrived, time.time())


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


def check_ring(rank, sizes, device, group):
    """Compare the ring with dist.all_reduce on integer tensors (exact sums)."""
    checks = []
    for size in sizes:
        generator = torch.Generator().manual_seed(1000 * rank + size)
        ours = torch.randint(-100, 100, (size,), generator=generator).to(device)
        theirs = ours.clone()
        ring_all_reduce(ours, group)
        dist.all_reduce(theirs, group=group)
        checks.append({"size": size, "equal": bool(torch.equal(ours, theirs))})
    return checks


def bytes_written():
    """Bytes this process has written to files and sockets so far, as the Linux kernel
    counts them (wchar in /proc/self/io, all threads); None where there is no such file."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None


def count_traffic(numel, device, group):
    """One ring all-reduce and one dist.all_reduce of `numel` float32 values: the elements
    this rank sent, and the bytes the kernel saw this process write during each. Gloo
    sends everything through TCP sockets, even on one machine, so the kernel sees every
    byte; NCCL moves GPU data by other paths, so no bytes are counted there."""
    counted = dist.get_backend() == "gloo" and bytes_written() is not None
    found = {"elements_sent": None, "ring_bytes": None, "all_reduce_bytes": None}
    for method in ("ring", "all_reduce"):
        work = torch.ones(numel, device=device)
        dist.barrier(group=group)  # the barrier's own messages are written before the count
        start = bytes_written()
        if method == "ring":
            found["elements_sent"] = ring_all_reduce(work, group)
        else:
            dist.all_reduce(work, group=group)
        if counted:
            found[f"{method}_bytes"] = bytes_written() - start
    return found


def time_both(numel, repeats, device, group):
    """Median seconds of the ring and of dist.all_reduce on `numel` float32 values."""
    timings = {"ring": [], "all_reduce": []}
    for _ in range(repeats + 1):  # the first round warms up and is not counted
        for method in timings:
            work = torch.ones(numel, device=device)
            dist.barrier(group=group)
            start = time.perf_counter()
            if method == "ring":
                ring_all_reduce(work, group)
            else:
                dist.all_reduce(work, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize()
            timings[method].append(time.perf_counter() - start)
    return {method: sorted(times[1:])[repeats // 2] for method, times in timings.items()}


def measure_ring(k, args, rank, device):
    """The ring on the first k ranks: checks, traffic and times (None on the others)."""
    ranks = list(range(k))
    group = dist.new_group(ranks) if k < dist.get_world_size() else None  # every rank calls
    if rank not in ranks:
        return None
    return {"checks": check_ring(rank, args.ring_sizes, device, group),
            "traffic": count_traffic(args.timing_numel, device, group),
            "seconds": time_both(args.timing_numel, args.repeats, device, group)}


@record  # on failure, torchrun's report shows this rank's traceback (lesson 00)
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if world_size < 2:
        sys.exit("this script shows messages between ranks: start at least 2 processes")
    ring_world_sizes = args.ring_world_sizes or [world_size]
    if not all(2 <= k <= world_size for k in ring_world_sizes):
        sys.exit(f"--ring-world-sizes must lie between 2 and {world_size}")

    device = setup().device  # lesson 01: checks, device, process group
    seen = {}

    def keep(name, before, after):
        seen[name] = {"before": before, "after": after}

    point_to_point(rank, world_size, device, keep)
    collectives(rank, world_size, device, keep)
    rings = {k: measure_ring(k, args, rank, device) for k in ring_world_sizes}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"seen": seen, "rings": rings})

    if is_rank0:
        for k, ring in rings.items():
            print(f"{k} ranks: ring equals dist.all_reduce: {ring['checks']}; "
                  f"{args.timing_numel} floats: ring {ring['seconds']['ring'] * 1e3:.1f} ms, "
                  f"all_reduce {ring['seconds']['all_reduce'] * 1e3:.1f} ms")
        if args.out:
            write_json(args, world_size, seen, rings, everyone)
    teardown()


def write_json(args, world_size, seen, rings, everyone):
    """Rank 0's findings: every rank's before/after per operation, and per ring world size
    the checks, every member's traffic and rank 0's times."""
    collectives = {name: {"before": [r["seen"][name]["before"] for r in everyone],
                          "after": [r["seen"][name]["after"] for r in everyone]}
                   for name in seen}
    counted = next(iter(rings.values()))["traffic"]["ring_bytes"] is not None
    ring_results = [{"world_size": k, "ring_checks": ring["checks"],
                     "traffic": {"numel": args.timing_numel,
                                 "element_size": torch.ones(1).element_size(),
                                 "bytes_counted_by": "/proc/self/io wchar" if counted else None,
                                 "ranks": [r["rings"][k]["traffic"] for r in everyone[:k]]},
                     "timing": {"numel": args.timing_numel, "repeats": args.repeats,
                                "seconds": ring["seconds"]}}
                    for k, ring in rings.items()]
    with open(args.out, "w") as f:
        json.dump({"world_size": world_size, "backend": dist.get_backend(),
                   "collectives": collectives, "rings": ring_results}, f, indent=1)


if __name__ == "__main__":
    main()
