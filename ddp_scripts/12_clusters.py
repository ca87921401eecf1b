"""Lesson 12: the course's DDP training, run on a cluster of two hosts.

Each rank says where it runs (host name, node, the addresses of its TCP connections to the
other ranks, read from /proc), then the ranks train lesson 05's network on the digits.
Started by torchrun, or by Slurm's srun without torchrun: then it takes its rank from
Slurm's variables. With --link-down-at, instead of training the ranks all-reduce once a
step, and at that step the last rank pulls its host's cable out (`ip link set eth0 down`).

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=nodeA:29500 \\
        --rdzv-id=job1 ddp_scripts/12_clusters.py          # the same on every node
    srun python ddp_scripts/12_clusters.py                # in a batch script: lesson 12
"""

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from ddp_common import record, setup, teardown

lesson05 = importlib.import_module("05_ddp_training")  # its train(): a name can't start with 0


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30,
                        help="seconds a collective waits before it fails")
    parser.add_argument("--link-down-at", type=int, metavar="STEP",
                        help="all-reduce once a step; at STEP the last rank's link goes down")
    parser.add_argument("--out", help="rank 0 writes what every rank found as JSON")
    return parser.parse_args()


def from_slurm():
    """Under srun without torchrun: torch's variables from Slurm's. The batch script sets
    MASTER_ADDR and MASTER_PORT."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return False
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: started by srun, but {' and '.join(missing)} not set: the "
                 "batch script must export them (see ddp_scripts/12_srun_python.sbatch)")
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
    # SLURM_TASKS_PER_NODE is always there, for example "2(x2)": 2 tasks on each of 2 nodes
    os.environ["LOCAL_WORLD_SIZE"] = os.environ.get("SLURM_NTASKS_PER_NODE") or \
        os.environ["SLURM_TASKS_PER_NODE"].split("(")[0].split(",")[0]
    os.environ["GROUP_RANK"] = os.environ["SLURM_NODEID"]
    return True


def address(hex_address):
    """'0100007F:1F90' (from /proc/net/tcp) -> '127.0.0.1:8080'; IPv4 inside IPv6 too."""
    ip, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, len(ip), 8))
    text = socket.inet_ntoa(raw[-4:]) if len(raw) == 4 or raw[:12] == bytes(10) + b"\xff\xff" \
        else socket.inet_ntop(socket.AF_INET6, raw)
    return f"{text}:{int(port, 16)}"


def connections():
    """This process's established TCP connections, as 'local -> remote'."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            mine.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and f"socket:[{fields[9]}]" in mine:  # 01: established
                found.append(f"{address(fields[1])} -> {address(fields[2])}")
    return sorted(found)


def heartbeat(world, link_down_at):
    """All-reduce once a step until something fails; the last rank cuts its link."""
    for step in range(1000):
        if step == link_down_at and world.rank == world.world_size - 1:
            print(f"rank {world.rank}: step {step}, taking eth0 down", flush=True)
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as error:
            print(f"rank {world.rank}: step {step} failed after "
                  f"{time.monotonic() - start:.1f} s: {error}", flush=True)
            raise
        time.sleep(0.1)


@record
def main():
    args = parse_args()
    by_slurm = from_slurm()
    world = setup(timeout_s=args.timeout)
    if args.link_down_at is not None:
        heartbeat(world, args.link_down_at)
    facts, history, weights, _ = lesson05.train(world.rank, world.world_size, world.device,
                                                args, world.rank == 0)
    me = {"rank": world.rank, "local_rank": world.local_rank,
          "node": int(os.environ["GROUP_RANK"]), "host": socket.gethostname(),
          "by_slurm": by_slurm, "master": f"{os.environ['MASTER_ADDR']}:"
          f"{os.environ['MASTER_PORT']}", "slurm_job": os.environ.get("SLURM_JOB_ID"),
          "connections": connections(), "weights_sum": sum(weights)}
    everyone = [None] * world.world_size
    dist.all_gather_object(everyone, me)
    teardown()
    if world.rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"ranks": everyone, "history": history}, f)


if __name__ == "__main__":
    main()
