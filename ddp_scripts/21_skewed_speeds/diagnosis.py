"""Lesson 21, section 3: which rank, which collective? Two failures on purpose, each on
a Gloo group of its own with a short timeout (--short-timeout), caught and recorded:

1. the slow rank comes late to a monitored_barrier, and rank 0 names it;
2. rank 0 runs a collective the others do not, on a plain group and on a DETAIL group.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/diagnosis.py
"""

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown
from skew_helpers import attempt, pick_slow_rank


def late_for_monitored_barrier(rank, slow, short_timeout):
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=short_timeout))
    if rank == slow:
        time.sleep(short_timeout)  # twice the barrier's timeout: far too late
    return attempt(lambda: dist.monitored_barrier(
        group=group, timeout=timedelta(seconds=short_timeout / 2), wait_all_ranks=True))


def mismatched_collective(rank, short_timeout, detail):
    """Rank 0 all-reduces a metric (say, for a log line) that the other ranks never
    reduce: they are already at the next collective, a broadcast."""
    level = dist.get_debug_level()
    if detail:  # groups created from now on check every collective across ranks first
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=short_timeout))
    dist.set_debug_level(level)  # back to what it was, for the groups created later
    metric = torch.ones(3)
    if rank == 0:
        return attempt(lambda: dist.all_reduce(metric, group=group))
    return attempt(lambda: dist.broadcast(metric, src=0, group=group))


@record  # an exception that ends main() goes into torchrun's report (lesson 01)
def main():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--short-timeout", type=float, default=1.0,
                        help="timeout of the groups that fail, seconds")
    parser.add_argument("--slow-rank", type=int, help="default: the last rank")
    args = parser.parse_args()
    rank, _, world_size, _ = setup(args.device, timeout_s=30)  # 30 s: fails if stuck
    slow = pick_slow_rank(args.slow_rank, world_size)
    mine = {"monitored_barrier": late_for_monitored_barrier(rank, slow, args.short_timeout)}
    dist.barrier()  # every rank starts the next experiment together
    mine["mismatch"] = mismatched_collective(rank, args.short_timeout, detail=False)
    dist.barrier()
    mine["mismatch_detail"] = mismatched_collective(rank, args.short_timeout, detail=True)
    report(args.out, mine, slow_rank=slow, short_timeout=args.short_timeout)
    teardown()


if __name__ == "__main__":
    main()
