"""Exercise (lesson 10): write phase 1 of ring all-reduce (reduce-scatter); phase 2 is given.
Each rank compares its result with dist.all_reduce's and counts the elements it sent.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/10_collectives/ring_exercise.py
"""

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown

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
    parser = arguments(__doc__)
    parser.set_defaults(device="cpu")  # CPU tensors and Gloo unless asked (lesson 02)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 12, 1001, 1200])
    parser.add_argument("--timeout", type=float, default=20, help="seconds, then Gloo gives up")
    args = parser.parse_args()
    rank, _, n, device = setup(args.device, timeout_s=args.timeout)
    results = []
    for size in args.sizes:
        generator = torch.Generator().manual_seed(rank)
        t = torch.randint(-100, 100, (size,), generator=generator).to(device)
        expected = t.clone()
        dist.all_reduce(expected)
        before = sent
        chunks = torch.tensor_split(t, n)  # views: the phases work on t itself
        reduce_scatter(chunks, rank, n)
        all_gather(chunks, rank, n)
        results.append({"size": size, "equal": torch.equal(t, expected), "sent": sent - before})
    print(f"rank {rank}: {results}")
    report(args.out, results)  # rank 0 writes every rank's results
    teardown()


if __name__ == "__main__":
    main()
