"""Exercise (lesson 20): join the group in a job started the way Slurm's srun
starts one: each task gets SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS, and none of the
variables torchrun sets. Rank 0 hosts the store at --addr:--port (on a cluster: the first node's
address, which a batch script reads from Slurm's node list). Each rank then checks the world.

    SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 \\
        python ddp_scripts/20_rendezvous_failures/slurm_exercise.py \\
        --port 29500 &
    SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=2 \\
        python ddp_scripts/20_rendezvous_failures/slurm_exercise.py \\
        --port 29500
"""

import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def join(addr, port, timeout):
    """Join the default process group (Gloo) from Slurm's variables."""
    # STUB: dist.init_process_group("gloo", timeout=timeout)  # env:// finds no RANK: fix it
    ### BEGIN SOLUTION
    rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    ### END SOLUTION


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--addr", default="127.0.0.1", help="where rank 0 hosts the store")
    parser.add_argument("--port", type=int, help="a free port on --addr (required)")
    parser.add_argument("--timeout", type=float, default=10, help="seconds, then give up")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON")
    args = parser.parse_args()
    torchrun_variables = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                          if name in os.environ]  # what the launcher gave, before join()
    if "SLURM_PROCID" not in os.environ:
        sys.exit(f"{sys.argv[0]}: SLURM_PROCID not set. This script is one task of a Slurm "
                 f"job step: start it with srun, or give each process SLURM_PROCID, "
                 f"SLURM_LOCALID and SLURM_NTASKS yourself (see --help).")
    if args.port is None:
        parser.error("--port is required: where rank 0 hosts the store")
    join(args.addr, args.port, timedelta(seconds=args.timeout))
    ones = torch.ones(1)
    dist.all_reduce(ones)  # the world, checked: the sum of one 1 per rank
    mine = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "SLURM_PROCID": os.environ["SLURM_PROCID"], "sum_of_ones": ones.item(),
            "torchrun_variables": torchrun_variables}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    print(f"rank {mine['rank']} of {mine['world_size']}: the sum of ones is {ones.item():g}")
    if dist.get_rank() == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(everyone, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
