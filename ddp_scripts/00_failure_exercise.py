"""Exercise (lesson 00, how the course works): a rank that finds its shard empty stops
the job, and torchrun's report says which rank and why.

Each rank checks its shard of the data before joining the group. With --empty-rank R,
rank R finds its shard empty. Make that failure reach torchrun's report, traceback and
message included.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/00_failure_exercise.py --empty-rank 1
"""

import argparse
import os
import sys  # noqa: F401 (the stub calls sys.exit)

import torch.distributed as dist
from ddp_common import require_torchrun
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--empty-rank", type=int, help="this rank's shard is empty")
    parser.add_argument("--out", help="not used: the script writes no results")
    return parser.parse_args()


# STUB: def main():
### BEGIN SOLUTION
@record  # the exception that ends main() goes into torchrun's report
def main():
### END SOLUTION
    args = parse_args()
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shard = [] if rank == args.empty_rank else range(rank, 1536, world_size)  # its samples
    if not shard:
        # STUB: sys.exit(f"rank {rank}: my shard of the data is empty")
        ### BEGIN SOLUTION
        raise ValueError(f"rank {rank}: my shard of the data is empty")
        ### END SOLUTION
    dist.init_process_group(backend="gloo")
    print(f"rank {rank}: {len(shard)} samples")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
