"""Lesson 33: will it scale? What the lesson's model of a DDP step needs, measured in rounds
(a change in the machine's load then hits every measurement alike). Each round times:
  1. all_reduce of each message size, 4 KiB to 16 MiB (the latency-bandwidth fit);
  2. one step of a plain MLP, no DDP: forward, backward, and when each gradient is ready;
  3. one step of the same MLP in DDP for each bucket_cap_mb, buckets noted by a comm hook.
Every time is the slowest rank's. Last, one DDP step under torch.autocast: what do its
buckets hold? With --out, rank 0 writes it all as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/33_will_it_scale/scaling.py
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP

SIZES = [1024 * 4 ** k for k in range(1, 8)]  # 4 KiB ... 16 MiB


def make_model(width, depth, seed=0):
    """depth Linear(width, width) layers with ReLU, the same weights on every rank."""
    torch.manual_seed(seed)
    layers = [[nn.Linear(width, width), nn.ReLU()] for _ in range(depth)]
    return nn.Sequential(*sum(layers, []))


def slowest(values, device):
    """The largest of each value over the ranks: a collective ends when its last rank does."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # CUDA calls return before the GPU has finished


def time_all_reduce(t, calls):
    """Seconds per all_reduce of tensor t, over `calls` calls in a row after one more."""
    dist.all_reduce(t)  # warm up: connections, buffers
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    sync(t.device)
    return slowest([(time.perf_counter() - start) / calls], t.device)[0]


def note_ready(ready, name):
    """A hook that notes when param's gradient for this backward is ready."""
    def note(param):
        ready.setdefault(name, time.perf_counter())
    return note


def all_reduce_bucket(events, model):
    """A communication hook that does what DDP does without one, noting each bucket's
    index, size, parameters, when it is handed over and when its all_reduce is done."""
    names = {id(p): name for name, p in model.named_parameters()}

    def hook(state, bucket):  # DDP calls it once every gradient in the bucket is ready
        buffer = bucket.buffer()  # the gradients of the bucket, in one flat tensor
        event = {"index": bucket.index(), "bytes": buffer.numel() * buffer.element_size(),
                 "dtype": str(buffer.dtype), "at": time.perf_counter(),
                 "params": [names[id(p)] for p in bucket.parameters()]}
        events.append(event)

        def average(future):  # .then(average) runs it once the all_reduce is done,
            event["done"] = time.perf_counter()  # and what it returns becomes the bucket's
            return future.value()[0].div_(dist.get_world_size())  # gradients: sum / ranks

        return dist.all_reduce(buffer, async_op=True).get_future().then(average)
    return hook


class Timed:
    """Times one step (forward and backward, no optimizer), when each gradient is ready
    and, for a DDP model, when each bucket is ready, goes to all_reduce and comes back."""

    def __init__(self, model, ddp=None):
        self.model, self.net = model, ddp or model
        self.names = [name for name, _ in model.named_parameters()]
        self.ready, self.buckets = {}, []  # the hooks hold these, not self: no cycle
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(note_ready(self.ready, name))
        if ddp is not None:
            ddp.register_comm_hook(None, all_reduce_bucket(self.buckets, model))

    def step(self, x):
        self.ready.clear()
        self.buckets.clear()
        self.model.zero_grad(set_to_none=False)  # keeps the gradients' memory
        dist.barrier()
        start = time.perf_counter()
        loss = self.net(x).square().mean()
        sync(x.device)
        middle = time.perf_counter()
        loss.backward()  # with DDP: returns once every bucket's all_reduce is done
        sync(x.device)
        end = time.perf_counter()
        ready = [self.ready[name] - middle for name in self.names]
        forward, backward, *ready = slowest([middle - start, end - middle, *ready], x.device)
        buckets = [{**b, "ready": max(self.ready[name] for name in b["params"]) - middle,
                    "at": b["at"] - middle, "done": b["done"] - middle} for b in self.buckets]
        return {"forward": forward, "backward": backward, "step": forward + backward,
                "ready": dict(zip(self.names, ready)), "buckets": buckets}


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--width", type=int, default=512, help="features of each layer")
    parser.add_argument("--depth", type=int, default=16, help="number of Linear layers")
    parser.add_argument("--batch", type=int, default=64, help="rows per rank and step")
    parser.add_argument("--caps", type=float, nargs="+", default=[1, 4, 25],
                        help="the bucket_cap_mb values to time")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of measurements")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)
    device = world.device
    plain = Timed(make_model(args.width, args.depth).to(device))
    ddps = {}
    for cap in args.caps:
        model = make_model(args.width, args.depth).to(device)
        ids = [device.index] if device.type == "cuda" else None
        ddps[cap] = Timed(model, DDP(model, device_ids=ids, bucket_cap_mb=cap))
    x = torch.randn(args.batch, args.width, device=device)
    messages = {size: torch.ones(size // 4, device=device) for size in SIZES}
    for timed in [plain, *ddps.values()]:  # warm up; DDP rebuilds its buckets after step 1
        timed.step(x), timed.step(x)
    rounds = []
    for _ in range(args.rounds):
        row = {"all_reduce": {size: time_all_reduce(t, calls=min(32, max(2, 2 ** 22 // size)))
                              for size, t in messages.items()},  # about 4 MiB, 2 to 32 calls
               "plain": plain.step(x)}
        row["ddp"] = {cap: timed.step(x) for cap, timed in ddps.items()}
        rounds.append(row)
    logging = {cap: {key: value for key, value in timed.net._get_ddp_logging_data().items()
                     if key.startswith(("avg_", "iteration"))} for cap, timed in ddps.items()}
    with torch.autocast(device.type, dtype=torch.bfloat16):  # mixed precision, as on GPUs
        autocast = ddps[args.caps[-1]].step(x)
    nbytes = sum(p.numel() * p.element_size() for p in plain.model.parameters())
    report(args.out, {"rank": world.rank}, rounds=rounds, logging=logging, caps=args.caps,
           gradient_bytes=nbytes, device=str(device), backend=dist.get_backend(),
           threads=torch.get_num_threads(), cores=os.cpu_count(), width=args.width,
           depth=args.depth, batch=args.batch, autocast_buckets=autocast["buckets"])
    del plain, ddps, timed, model  # no DDP model may outlive the group (lesson 13)
    teardown()


if __name__ == "__main__":
    main()
