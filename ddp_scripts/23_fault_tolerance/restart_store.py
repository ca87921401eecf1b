"""Lesson 23: joining the group again after a torchrun restart (fault_tolerance.py
imports it). torchrun's agent keeps the store the ranks meet through from one attempt to
the next, with the keys the dead processes wrote; init_for_restarts joins under a key
prefix per attempt. Run on its own, every rank joins and rank 0 lists the keys published:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/23_fault_tolerance/restart_store.py
"""

import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist
from ddp_common import arguments, pick_device, record, report, require_torchrun, teardown


def launcher_store(world_size, timeout=timedelta(seconds=60)):
    """A client of the store torchrun's agent hosts, or None if the agent shares none
    (then rank 0 hosts a new store for each attempt)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         world_size, is_master=False, timeout=timeout)


def init_for_restarts(backend, rank, world_size, restart, timeout):
    """init_process_group, safe across torchrun restarts.

    torchrun's agent hosts the store and keeps it across restarts, with the keys the
    previous processes wrote: among them where to reach each rank. A restarted rank
    that reads one of those before its new value is written connects to a dead
    process. A prefix per restart gives each attempt keys of its own."""
    store = launcher_store(world_size, timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)  # a fresh store every time
        return
    dist.init_process_group(backend, store=dist.PrefixStore(f"restart-{restart}", store),
                            rank=rank, world_size=world_size, timeout=timeout)


def addresses_in_store(world_size):
    """The keys in the agent's store where ranks published their addresses: this
    attempt's, and whatever earlier attempts left there."""
    store = launcher_store(world_size)
    return [] if store is None else sorted(
        k for k in store.list_keys() if not k.startswith("ddp-course-meet"))


def meet(world_size, restart):
    """Wait (up to a minute) until every rank of this attempt has arrived, using the
    launcher's store and keys of our own."""
    store = launcher_store(world_size)
    if store is None:
        return
    key = f"ddp-course-meet-{restart}"
    store.add(key, 1)
    deadline = time.monotonic() + 60
    while store.add(key, 0) < world_size:
        if time.monotonic() > deadline:
            sys.exit("the other ranks did not arrive within 60 s")
        time.sleep(0.01)


@record
def main():
    args = arguments(__doc__).parse_args()  # --device, --out (lesson 02)
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = dist.get_default_backend_for_device(pick_device(args.device))
    init_for_restarts(backend, rank, world_size, int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                      timedelta(seconds=30))
    dist.barrier()  # every rank has published its address
    report(args.out, {}, backend=backend, keys=addresses_in_store(world_size))
    teardown()


if __name__ == "__main__":
    main()
