"""Lesson 31, section 3: torch.distributed.rpc, in maintenance mode, still runs.

Every process joins as an RPC worker; rank 0 calls a function on every worker and keeps a
reference (RRef) to a tensor that stays on the last one. The warnings init_rpc raises are
kept. No process group: RPC finds its peers through torchrun's MASTER_ADDR and MASTER_PORT.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/31_pipeline_ddp/rpc.py
"""

import argparse
import os
import warnings

import torch
import torch.distributed.rpc as rpc
from ddp_common import record, require_torchrun, write_json


def describe(rank):
    """Runs wherever RPC sends it: who and where am I?"""
    return {"asked_for": rank, "pid": os.getpid(), "rank": int(os.environ["RANK"])}


@record
def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="rank 0 writes what it got back as JSON here")
    args = parser.parse_args()
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=20))
    found = {"warnings": sorted({str(w.message) for w in caught}), "torch": torch.__version__}
    if rank == 0:
        found["answers"] = [rpc.rpc_sync(f"worker{r}", describe, args=(r,))
                            for r in range(world_size)]
        held = rpc.remote(f"worker{world_size - 1}", torch.arange, args=(4,))
        found["rref"] = {"owner": held.owner().name, "value": held.to_here().tolist()}
    rpc.shutdown()  # waits for every worker: a barrier
    if rank == 0 and args.out:
        write_json(args.out, found)


if __name__ == "__main__":
    main()
