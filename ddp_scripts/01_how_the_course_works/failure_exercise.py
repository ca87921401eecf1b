"""Exercise (lesson 01, how the course works): a rank that finds its shard empty stops
the job, and torchrun's report says which rank and why.

Each rank checks its shard of the data before joining the group. With --empty-rank R,
rank R finds its shard empty. Make that failure reach torchrun's report, traceback and
message included.

    torchrun --standalone --nproc-per-node=2 \\
        ddp_scripts/01_how_the_course_works/failure_exercise.py --empty-rank 1
"""

import os
import sys  # noqa: F401 (the stub calls sys.exit)

from ddp_common import arguments, report, require_torchrun, setup, teardown
from torch.distributed.elastic.multiprocessing.errors import record


# STUB: def main():
### BEGIN SOLUTION
@record  # the exception that ends main() goes into torchrun's report
def main():
### END SOLUTION
    parser = arguments(__doc__)
    parser.add_argument("--empty-rank", type=int, help="this rank's shard is empty")
    args = parser.parse_args()
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shard = [] if rank == args.empty_rank else range(rank, 1536, world_size)  # its samples
    if not shard:
        # STUB: sys.exit(f"rank {rank}: my shard of the data is empty")
        ### BEGIN SOLUTION
        raise ValueError(f"rank {rank}: my shard of the data is empty")
        ### END SOLUTION
    setup(args.device)
    print(f"rank {rank}: {len(shard)} samples")
    report(args.out, {"samples": len(shard)})
    teardown()


if __name__ == "__main__":
    main()
