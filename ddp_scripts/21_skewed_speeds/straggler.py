"""Lesson 21, section 1: a straggler. One rank sleeps --delay seconds in each step; every
rank records, per step, when it started, when its gradients were ready (a communication
hook sees it) and when the all-reduce ended.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/straggler.py
"""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from skew_helpers import batch, make_model, pick_slow_rank, wrap


def straggler(rank, slow, steps, delay, device):
    """Per step: start, gradients ready (seen by a communication hook), all-reduce done."""
    ddp = wrap(make_model(device), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ready = []

    def hook(state, bucket):  # DDP calls it when this rank's gradients are all computed
        ready.append(time.perf_counter())
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return future.then(lambda f: f.value()[0].div_(dist.get_world_size()))

    ddp.register_comm_hook(None, hook)
    dist.barrier()  # a common start line, so that the ranks' clocks can be compared
    origin = time.perf_counter()
    timeline = []
    for step in range(steps):
        start = time.perf_counter()
        if rank == slow:
            time.sleep(delay)  # a slow data loader, a slower GPU, a busy node...
        x, y = batch(step, rank, device)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()  # returns once the all-reduce has finished ...
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # ... on a GPU: once it is queued, so wait here
        end = time.perf_counter()
        optimizer.step()
        timeline.append({"start": start - origin, "ready": max(ready) - origin,
                         "end": end - origin})
        ready.clear()
    return timeline


@record  # an exception that ends main() goes into torchrun's report (lesson 01)
def main():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.1,
                        help="seconds the slow rank sleeps in each step")
    parser.add_argument("--slow-rank", type=int, help="default: the last rank")
    args = parser.parse_args()
    rank, _, world_size, device = setup(args.device, ddp=True)  # lessons 02, 13
    slow = pick_slow_rank(args.slow_rank, world_size)
    timeline = straggler(rank, slow, args.steps, args.delay, device)
    report(args.out, {"timeline": timeline}, slow_rank=slow, steps=args.steps,
           delay=args.delay, device=str(device))
    teardown()


if __name__ == "__main__":
    main()
