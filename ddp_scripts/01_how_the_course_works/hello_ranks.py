"""Lesson 01: every rank reports what torchrun told it.

Each process reads the variables torchrun sets, joins the process group, and
sends its findings (and its whole environment) to the others. Rank 0 prints a
summary and, with --out, writes it as JSON. --fail-rank makes one rank fail on
purpose, to read torchrun's failure report.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/01_how_the_course_works/hello_ranks.py
"""

import argparse
import json
import os
import socket
import sys

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

TORCHRUN_VARIABLES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                      "MASTER_ADDR", "MASTER_PORT"]


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fail-rank", type=int,
                        help="this rank raises an error before joining the group")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path "
                                      "(each rank's environment included)")
    return parser.parse_args()


def require_torchrun():
    """Stop with a clear message when started by plain `python`."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: {', '.join(missing)} not set. This script is one rank "
                 f"of a distributed job: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")


@record  # an exception that ends main() goes into torchrun's report, traceback and all
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose (--fail-rank {rank})")

    # Lesson 01 only swaps small Python objects, which Gloo does on the CPU of any
    # machine. Lesson 02 picks the backend from the device instead.
    dist.init_process_group(backend="gloo")

    mine = {name: os.environ[name] for name in TORCHRUN_VARIABLES}
    mine.update(pid=os.getpid(), hostname=socket.gethostname(), environ=dict(os.environ))
    print(f"I am rank {rank} of {world_size}: local rank {mine['LOCAL_RANK']}, "
          f"pid {mine['pid']}, master {mine['MASTER_ADDR']}:{mine['MASTER_PORT']}")

    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)  # every rank receives every rank's dict

    if is_rank0:
        print(f"rank 0 heard from ranks {[int(r['RANK']) for r in everyone]}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "ranks": everyone}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
