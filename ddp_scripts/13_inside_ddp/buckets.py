"""Lesson 13, section 2: DDP all-reduces the gradients in buckets while backward still
runs. A communication hook notes when each bucket is handed over and comes back, a hook on
each parameter when its gradient is ready; three steps by default, three with
find_unused_parameters=True; every rank's second step makes a timeline.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/buckets.py
"""

import time

import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from small_model import make_data, make_model, wrap


def record_buckets(device, bucket_cap_mb, find_unused_parameters, num_steps=3):
    """When each gradient is ready, each bucket handed over and back, in seconds from the
    start of backward (backward_from_barrier after a barrier all ranks left together)."""
    model = make_model(seed=0).to(device)
    ddp = wrap(model, device, bucket_cap_mb=bucket_cap_mb,
               find_unused_parameters=find_unused_parameters)
    names = {id(p): name for name, p in model.named_parameters()}
    events, ready = [], {}

    def hook(state, bucket):  # called by DDP once every gradient in the bucket is ready
        event = {"bucket": bucket.index(), "at": time.perf_counter(),
                 "params": [names[id(p)] for p in bucket.parameters()],
                 "numel": bucket.buffer().numel()}
        events.append(event)

        def average(future):  # runs when the all-reduce has finished
            event["done"] = time.perf_counter()
            return future.value()[0].div_(dist.get_world_size())

        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(average)

    def gradient_ready(name):
        def note(param):  # runs once param.grad holds this backward's gradient
            ready.setdefault(name, time.perf_counter())
        return note

    ddp.register_comm_hook(None, hook)
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(gradient_ready(name))
    x, y = make_data(32)
    steps = []
    for _ in range(num_steps):  # DDP may rebuild its buckets after the first step
        events.clear()
        ready.clear()
        dist.barrier()  # a common start for the timelines of all ranks
        common = time.perf_counter()
        loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        steps.append({
            "buckets": [{**e, "at": e["at"] - start, "done": e["done"] - start} for e in events],
            "grad_ready": {name: t - start for name, t in ready.items()},
            "backward_seconds": end - start, "backward_from_barrier": start - common})
    return {"parameters": list(names.values()), "steps": steps}


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.004,
                        help="DDP's bucket size in MiB (default None: 25; tiny here: several)")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)
    default = record_buckets(world.device, args.bucket_cap_mb, False)
    unused = record_buckets(world.device, args.bucket_cap_mb, True)
    report(args.out, {"timeline": default["steps"][1]},  # every rank's second step
           device=str(world.device), buckets=default, buckets_find_unused=unused)  # rank 0's
    teardown()


if __name__ == "__main__":
    main()
