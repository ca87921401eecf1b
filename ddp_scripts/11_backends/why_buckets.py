"""Lesson 11: why DDP sends gradients in buckets. Many small tensors all-reduced one call
each, against one flat bucket of the same total size; then the gradient buckets DDP itself
makes for an 8-layer model with bucket_cap_mb None (the default) and 25. With --out, rank 0
writes both as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/11_backends/why_buckets.py
"""

import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown, write_json
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def compare_bucketing(count, numel, device):
    """all_reduce `count` tensors one call each, against one flat tensor of the same size."""
    tensors = [torch.ones(numel, device=device) for _ in range(count)]
    bucket = torch.ones(count * numel, device=device)
    timings = {}
    for name in ("one call per tensor", "one bucket", "one call per tensor", "one bucket"):
        dist.barrier()
        start = time.perf_counter()
        for t in [bucket] if name == "one bucket" else tensors:
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize()  # CUDA calls return before the GPU has finished
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64,
                               device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
        timings[name] = elapsed.item()  # the second round (warm) is the one kept
    return timings


def ddp_bucket_sizes(bucket_cap_mb, device):
    """Bytes per gradient bucket, in the order DDP all-reduced them in its second step,
    for a model of 8 layers of 257 KiB of parameters each (2 MiB in all)."""
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).to(device)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    sizes = []

    def note_then_all_reduce(process_group, bucket):  # a communication hook (lesson 13)
        sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return allreduce_hook(process_group, bucket)  # what DDP does without a hook

    ddp.register_comm_hook(None, note_then_all_reduce)
    for _ in range(2):  # DDP rebuilds its buckets after the first step (lesson 13)
        sizes.clear()
        ddp(torch.randn(4, 256, device=device)).sum().backward()
    return sizes


@record  # on failure, torchrun's report carries this rank's traceback (lesson 01)
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device, ddp=True)  # ddp: a script that builds DDP models (lesson 13)
    bucketing = compare_bucketing(count=256, numel=1024, device=world.device)  # 256 x 4 KiB
    buckets = {str(cap): ddp_bucket_sizes(cap, world.device) for cap in (None, 25)}
    if world.rank == 0:
        print(f"256 tensors of 4 KiB: {bucketing}\nDDP's buckets, bytes: {buckets}")
        if args.out:
            write_json(args.out, {"world_size": world.world_size, "bucketing": bucketing,
                                  "ddp_buckets": buckets})
    teardown()


if __name__ == "__main__":
    main()
