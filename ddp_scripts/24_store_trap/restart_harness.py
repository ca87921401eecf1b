"""Lesson 24, exercise 1: the job around ddp_scripts/24_store_trap/restart_exercise.py's
init_for_restarts. Not a script of its own: the exercise calls run_exercise(init_for_restarts).
Start it with torchrun --max-restarts=1. Attempt 0: every rank joins with
init_for_restarts, all-reduces, leaves; then the last rank fails on purpose, so torchrun
restarts the group. Attempt 1: rank 0 joins --late seconds after the others (a slow node),
and the ranks all-reduce ones. After joining, rank 0 notes the keys in the agent's store;
in attempt 1 it writes them, both attempts', as JSON. CPU and Gloo."""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from ddp_common import record, require_torchrun


def agent_store(timeout=timedelta(seconds=60)):
    """A client of the store that torchrun's agent hosts and keeps across restarts."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)


def arrive(store, key, world_size):
    """Count this rank in under `key`, then wait (up to a minute) for every rank."""
    store.add(key, 1)
    deadline = time.monotonic() + 60
    while store.add(key, 0) < world_size:
        if time.monotonic() > deadline:
            sys.exit("the other ranks did not arrive within 60 s")
        time.sleep(0.01)


@record
def run_exercise(init_for_restarts):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--late", type=float, default=1.5,
                        help="seconds rank 0 joins after the others in attempt 1")
    parser.add_argument("--timeout", type=float, default=5,
                        help="seconds init and collectives wait, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args()
    require_torchrun()  # lesson 01
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        sys.exit("torchrun does not share its store here (TORCH_DISABLE_SHARE_RDZV_TCP_STORE "
                 "is set, or a torch that does not share it, such as 2.3): nothing to fix")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    timeout = timedelta(seconds=args.timeout)
    store = agent_store()
    if restart > 0:
        arrive(store, f"exercise-arrived-{restart}", world_size)
        if rank == 0:
            time.sleep(args.late)
    init_for_restarts(rank, world_size, restart, timeout)
    ones = torch.ones(1)
    dist.all_reduce(ones)  # every rank has joined: all their keys are in the store
    dist.destroy_process_group()
    if rank == 0:
        keys = sorted(k for k in store.list_keys() if not k.startswith("exercise-"))
        store.set(f"exercise-keys-{restart}", json.dumps(keys))
    if restart == 0 and rank == world_size - 1:
        sys.exit(f"attempt 0: rank {rank} fails on purpose")
    if rank == 0 and args.out and restart > 0:
        with open(args.out, "w") as f:
            json.dump({"world_size": world_size, "restart": restart, "sum_of_ones": ones.item(),
                       "keys_attempt_0": json.loads(store.get("exercise-keys-0")),
                       "keys_attempt_1": keys}, f)
