"""Lesson 11: what the backend accepts. Each rank tries every operation of lesson 10 (and
all_to_all) once, and all_reduce with every ReduceOp on float32 and int64 tensors, to
record which ones this backend accepts on this device. With --out, rank 0 writes what
it found as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/11_backends/backends.py
"""

import sys

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown, write_json

REDUCE_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]


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


@record  # on failure, torchrun's report carries this rank's traceback (lesson 01)
def main():
    parser = arguments(__doc__)
    parser.add_argument("--backend", default="auto",
                        help="auto (from the device), gloo, nccl, mpi, or a per-device "
                             "list such as cpu:gloo,cuda:nccl")
    args = parser.parse_args()
    if args.backend != "auto":
        check_backend(args.backend)  # before init_process_group fails on it
    world = setup(args.device, args.backend)  # auto: the device's backend (lesson 02)
    if world.world_size < 2:
        sys.exit("this script probes messages between ranks: start at least 2 processes")
    found = {"supported": probe_operations(world.device),
             "reduce_ops": probe_reduce_ops(world.device),
             "average_by_sum": average_by_sum(world.device)}
    if world.rank == 0 and args.out:
        write_json(args.out, {"world_size": world.world_size, "backend": dist.get_backend(),
                              "device": str(world.device), **found})
    teardown()


if __name__ == "__main__":
    main()
