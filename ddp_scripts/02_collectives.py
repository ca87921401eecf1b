"""Lesson 02: point-to-point messages, every collective, and a ring all-reduce by hand.

Every rank starts each operation from a small tensor whose values tell where they came
from (rank r holds r+1, or 10*r + i), records what it held before and after, and rank 0
writes all of it as JSON. Then the hand-written ring all-reduce is compared with
dist.all_reduce: for correctness, for what each rank sends (its own count, and the bytes
the Linux kernel saw it write), and for time.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/02_collectives.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ring-sizes", type=int, nargs="+", default=[1, 7, 1001],
                        help="tensor sizes for the ring all-reduce check (any size works)")
    parser.add_argument("--timing-numel", type=int, default=1 << 20,
                        help="float32 elements in the counted and timed all-reduce "
                             "(default 1 Mi, 4 MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each method")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def require_torchrun():
    """Stop with a clear message when started by plain `python`."""
    missing = [name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: {', '.join(missing)} not set. This script is one rank "
                 f"of a distributed job: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")


def pick_device(local_rank):
    """cuda:LOCAL_RANK when GPUs are visible, otherwise the CPU (lesson 01)."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def show_collectives(rank, world_size, device):
    """Run each operation on small tensors; return {name: {"before": .., "after": ..}}."""
    n = world_size
    seen = {}

    def keep(name, before, after):
        seen[name] = {"before": before, "after": after}

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
    return seen


def ring_all_reduce(t):
    """Sum `t` over all ranks with send/recv only, the way ring all-reduce does it.

    The tensor is cut into world_size chunks (of unequal sizes if needed). Phase 1,
    reduce-scatter: in n-1 steps every rank passes a chunk to its right neighbour and
    adds the chunk coming from its left; afterwards rank r holds the full sum of chunk
    (r+1) % n. Phase 2, all-gather: n-1 more steps pass the finished chunks around.
    Returns the sum and the number of elements this rank handed to isend.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in torch.tensor_split(t.flatten(), n)]
    right, left = (rank + 1) % n, (rank - 1) % n
    sent = 0

    def pass_along(send_index, receive_index):
        nonlocal sent
        incoming = torch.empty_like(chunks[receive_index])
        # Send right and receive from the left at the same time: if every rank sent
        # first and received after, a ring of blocking sends could wait on itself.
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[send_index], right),
                                           dist.P2POp(dist.irecv, incoming, left)])
        for request in requests:
            request.wait()
        sent += chunks[send_index].numel()
        return incoming

    for step in range(n - 1):  # phase 1: reduce-scatter
        receive_index = (rank - step - 1) % n
        chunks[receive_index] += pass_along((rank - step) % n, receive_index)
    for step in range(n - 1):  # phase 2: all-gather
        receive_index = (rank - step) % n
        chunks[receive_index] = pass_along((rank - step + 1) % n, receive_index)
    return torch.cat(chunks).view_as(t), sent


def check_ring(rank, sizes, device):
    """Compare the ring with dist.all_reduce on integer tensors (exact sums)."""
    checks = []
    for size in sizes:
        generator = torch.Generator().manual_seed(1000 * rank + size)
        t = torch.randint(-100, 100, (size,), generator=generator).to(device)
        ours, _ = ring_all_reduce(t)
        theirs = t.clone()
        dist.all_reduce(theirs)
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


def count_traffic(numel, device):
    """One ring all-reduce and one dist.all_reduce of `numel` float32 values: the elements
    this rank handed to isend, and the bytes the kernel saw this process write during
    each. Gloo sends everything through TCP sockets, even on one machine, so the kernel
    sees every byte; NCCL moves GPU data by other paths, so no bytes are counted there."""
    counted = dist.get_backend() == "gloo" and bytes_written() is not None
    t = torch.ones(numel, device=device)
    found = {"elements_sent": None, "ring_bytes": None, "all_reduce_bytes": None}
    for method in ("ring", "all_reduce"):
        work = t.clone()
        dist.barrier()  # the barrier's own messages are written before the count starts
        start = bytes_written()
        if method == "ring":
            work, found["elements_sent"] = ring_all_reduce(work)
        else:
            dist.all_reduce(work)
        if counted:
            found[f"{method}_bytes"] = bytes_written() - start
    return found


def time_both(numel, repeats, device):
    """Median seconds of the ring and of dist.all_reduce on `numel` float32 values."""
    t = torch.ones(numel, device=device)
    timings = {"ring": [], "all_reduce": []}
    for _ in range(repeats + 1):  # the first round warms up and is not counted
        for method in timings:
            work = t.clone()
            dist.barrier()
            start = time.perf_counter()
            if method == "ring":
                work, _ = ring_all_reduce(work)
            else:
                dist.all_reduce(work)
            if device.type == "cuda":
                torch.cuda.synchronize()
            timings[method].append(time.perf_counter() - start)
    return {method: sorted(times[1:])[repeats // 2] for method, times in timings.items()}


@record  # on failure, torchrun's report shows this rank's traceback (lesson 00)
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if world_size < 2:
        sys.exit("this script shows messages between ranks: start at least 2 processes")

    device = pick_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))

    seen = show_collectives(rank, world_size, device)
    ring = check_ring(rank, args.ring_sizes, device)
    traffic = count_traffic(args.timing_numel, device)
    seconds = time_both(args.timing_numel, args.repeats, device)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"seen": seen, "traffic": traffic})

    if is_rank0:
        print(f"ring all-reduce equals dist.all_reduce: {ring}")
        print(f"{args.timing_numel} floats: ring {seconds['ring'] * 1e3:.1f} ms, "
              f"all_reduce {seconds['all_reduce'] * 1e3:.1f} ms; elements each rank sent "
              f"in the ring: {[r['traffic']['elements_sent'] for r in everyone]}")
        if args.out:
            collectives = {name: {"before": [r["seen"][name]["before"] for r in everyone],
                                  "after": [r["seen"][name]["after"] for r in everyone]}
                           for name in seen}
            bytes_by = "/proc/self/io wchar" if traffic["ring_bytes"] is not None else None
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "backend": dist.get_backend(),
                           "collectives": collectives, "ring_checks": ring,
                           "traffic": {"numel": args.timing_numel,
                                       "element_size": torch.ones(1).element_size(),
                                       "bytes_counted_by": bytes_by,
                                       "ranks": [r["traffic"] for r in everyone]},
                           "timing": {"numel": args.timing_numel, "repeats": args.repeats,
                                      "seconds": seconds}}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
