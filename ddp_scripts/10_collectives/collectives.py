"""Lesson 10: point-to-point messages and every collective, on small tensors whose values
tell where they came from (rank r holds r+1, or 10*r + i). Every rank records what it
held before and after each operation; rank 0 writes every rank's records as JSON.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/10_collectives/collectives.py
"""

import sys
import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown


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


@record  # on failure, torchrun's report shows this rank's traceback (lesson 01)
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device)  # lesson 02: checks, device, process group
    if world.world_size < 2:
        sys.exit("this script shows messages between ranks: start at least 2 processes")
    seen = {}  # operation: what this rank held before and after

    def keep(name, before, after):
        seen[name] = {"before": before, "after": after}

    point_to_point(world.rank, world.world_size, world.device, keep)
    collectives(world.rank, world.world_size, world.device, keep)
    report(args.out, seen, backend=dist.get_backend())  # every rank's, in rank order
    teardown()


if __name__ == "__main__":
    main()
