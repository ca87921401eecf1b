"""Exercise (lesson 02): write phase 1 of ring all-reduce (reduce-scatter); phase 2 is given.
Each rank compares its result with dist.all_reduce's and counts the elements it sent.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/02_ring_exercise.py
"""

import argparse
import json

import torch
import torch.distributed as dist
from ddp_common import record, setup, teardown

sent = 0  # elements this rank handed to exchange()


def exchange(outgoing, incoming, rank, n):
    """Send `outgoing` to the right neighbour while receiving `incoming` from the left."""
    global sent
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, (rank + 1) % n),
                                       dist.P2POp(dist.irecv, incoming, (rank - 1) % n)])
    for request in requests:
        request.wait()
    sent += outgoing.numel()


def reduce_scatter(chunks, rank, n):
    """Phase 1, in place: afterwards chunks[(rank + 1) % n] holds its sum over all ranks."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    for step in range(n - 1):
        mine = chunks[(rank - step - 1) % n]
        incoming = torch.empty_like(mine)
        exchange(chunks[(rank - step) % n], incoming, rank, n)
        mine += incoming
    ### END SOLUTION


def all_gather(chunks, rank, n):
    """Phase 2 (given): the finished chunks travel around the ring, received in place."""
    for step in range(n - 1):
        exchange(chunks[(rank - step + 1) % n], chunks[(rank - step) % n], rank, n)


@record
def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 12, 1001, 1200])
    parser.add_argument("--timeout", type=float, default=20, help="seconds, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    rank, _, n, _ = setup("cpu", timeout_s=args.timeout)  # CPU tensors, Gloo: lesson 01
    results = []
    for size in args.sizes:
        t = torch.randint(-100, 100, (size,), generator=torch.Generator().manual_seed(rank))
        expected = t.clone()
        dist.all_reduce(expected)
        before = sent
        chunks = torch.tensor_split(t, n)  # views: the phases work on t itself
        reduce_scatter(chunks, rank, n)
        all_gather(chunks, rank, n)
        results.append({"size": size, "equal": torch.equal(t, expected), "sent": sent - before})
    print(f"rank {rank}: {results}")
    everyone = [None] * n
    dist.all_gather_object(everyone, results)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": n, "ranks": everyone}, f, indent=1)
    teardown()


if __name__ == "__main__":
    main()
