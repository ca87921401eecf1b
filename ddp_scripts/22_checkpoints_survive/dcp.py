"""Lesson 22, section 8: a sharded checkpoint with torch.distributed.checkpoint (DCP).
Every rank writes its part: a table sharded by rows (a DTensor, as FSDP or tensor
parallelism hand you their parameters) and the model, with a plain torch.save of the
model beside it. With --load DIR, a job of any number of ranks loads such a checkpoint,
each rank asking for its rows, and checks every value.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/22_checkpoints_survive/dcp.py \\
        --dir /tmp/dcp-demo
    torchrun --standalone --nproc-per-node=1 ddp_scripts/22_checkpoints_survive/dcp.py \\
        --load /tmp/dcp-demo/dcp
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from checkpoints import load, save_atomic, shared_folder
from ddp_common import record, report, setup, teardown
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from training_run import Run, make_model, options

TABLE_ROWS = 12  # divisible by 1, 2, 3, 4 and 6 ranks


def full_table():
    return torch.arange(TABLE_ROWS * 4, dtype=torch.float32).reshape(TABLE_ROWS, 4)


def sharded_table(table, device):
    """`table`, split by rows (Shard(0)) over all the ranks of this job."""
    if TABLE_ROWS % dist.get_world_size():
        sys.exit(f"{dist.get_world_size()} ranks cannot share {TABLE_ROWS} rows evenly")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return distribute_tensor(table.to(device), mesh, [Shard(0)])


def dcp_save(args, world, folder):
    table = sharded_table(full_table(), world.device)
    run = Run(args, world.rank, world.device)
    run.train_until(2)
    model = run.ddp.module.state_dict()
    del run
    dcp.save({"table": table, "model": model}, checkpoint_id=folder / "dcp")
    if world.rank == 0:
        save_atomic(model, folder / "model.pt")
    dist.barrier()
    return {}, {"folder": str(folder / "dcp"), "files": sorted(os.listdir(folder / "dcp")),
                "rows_per_rank": table.to_local().shape[0]}


def dcp_load(folder, world):
    """Empty tensors sharded as this job shards them; dcp.load fills them in place."""
    table = sharded_table(torch.zeros(TABLE_ROWS, 4), world.device)
    model = {k: torch.zeros_like(v) for k, v in make_model().to(world.device)
             .state_dict().items()}
    dcp.load({"table": table, "model": model}, checkpoint_id=folder)
    reference = load(folder.parent / "model.pt", world.device)
    local = table.to_local()
    first = world.rank * local.shape[0]
    mine = {"rank": world.rank, "rows": local.shape[0], "first_value": local[0, 0].item(),
            "rows_right": torch.equal(local.cpu(), full_table()[first:first + len(local)])}
    return mine, {"table_equal": torch.equal(table.full_tensor().cpu(), full_table()),
                  "model_equal": all(torch.equal(model[k], reference[k]) for k in reference)}


@record
def main():
    parser = options(__doc__)
    parser.add_argument("--load", metavar="DIR", help="load the DCP checkpoint in DIR")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)
    if args.load:
        mine, found = dcp_load(Path(args.load), world)
    else:
        with shared_folder(args.dir) as folder:
            mine, found = dcp_save(args, world, folder)
    report(args.out, mine, **found)
    teardown()


if __name__ == "__main__":
    main()
