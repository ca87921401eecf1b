"""Lesson 04: what a checkpoint of a training_run.Run holds, how it is saved and loaded.
Run on its own, it trains to --stop-at, saves, loads, and reports what the file holds:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/shared/checkpoints.py
"""

import contextlib
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from ddp_common import record, report, setup, teardown
from training_run import Run, options, run_length


def rng_states(device):
    """This rank's random number generators, in types that weights_only accepts."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": [kind, keys.tolist(), position, has_gauss, gauss]}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states, device):
    torch.set_rng_state(states["torch"].cpu())  # map_location may have moved it
    random.setstate(states["python"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, gauss))
    if device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"].cpu(), device)


def capture(run):
    """The full training state. Every rank calls it (the RNG states are gathered)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rng_states(run.device))
    return {"model": run.ddp.module.state_dict(),  # no "module." prefix
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "step": run.step,  # optimizer steps done
            "epoch": run.step // len(run.loader),  # the sampler's epoch ...
            "step_in_epoch": run.step % len(run.loader),  # ... and the batches done in it
            "steps_per_epoch": len(run.loader),  # only valid for this world size and batch
            "rng": everyone}  # one entry per rank


RESTORE_ALL = ("model", "optimizer", "scheduler", "step", "rng")


def restore(run, checkpoint, parts=RESTORE_ALL):
    if checkpoint["steps_per_epoch"] != len(run.loader):
        sys.exit(f"the checkpoint was saved with {checkpoint['steps_per_epoch']} steps per "
                 f"epoch, this run has {len(run.loader)}: the world size or the batch size "
                 f"changed, so its position in the data does not apply here")
    if "model" in parts:
        run.ddp.module.load_state_dict(checkpoint["model"])
    if "optimizer" in parts:
        run.optimizer.load_state_dict(checkpoint["optimizer"])
    if "scheduler" in parts:
        run.scheduler.load_state_dict(checkpoint["scheduler"])
    if "step" in parts:
        run.step = checkpoint["step"]
    if "rng" in parts:
        set_rng_states(checkpoint["rng"][run.rank], run.device)


def scramble_rngs():
    """What a new process would have: random states that have nothing to do with ours."""
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)


def save_atomic(obj, path):
    """Write to a temporary file next to `path`, push it to the disk, then rename it:
    a crash leaves either the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX file systems
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # make the rename itself durable
    finally:
        os.close(folder)


def save_checkpoint(run, folder):
    """Every rank gathers; rank 0 writes; nobody goes on until the file is complete."""
    checkpoint = capture(run)
    path = Path(folder) / f"step-{run.step:06d}.pt"
    if run.rank == 0:
        save_atomic(checkpoint, path)
    dist.barrier()  # the others must not read the file before rank 0 has written it
    return path


def load(path, device):
    return torch.load(path, map_location=device, weights_only=True)


@contextlib.contextmanager
def shared_folder(path):
    """`path` (all ranks must see it: on several nodes, a shared file system), made if
    need be; without one, a temporary folder of rank 0's, removed afterwards."""
    name = [path or (tempfile.mkdtemp(prefix="ddp-course-07-") if dist.get_rank() == 0
                     else None)]
    dist.broadcast_object_list(name, src=0)  # everyone uses rank 0's folder
    folder = Path(name[0])
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    yield folder
    dist.barrier()
    if path is None and dist.get_rank() == 0:
        shutil.rmtree(folder)


@record
def main():
    args = options(__doc__).parse_args()
    world = setup(args.device, ddp=True)
    run_length(args)
    with shared_folder(args.dir) as folder:
        run = Run(args, world.rank, world.device)
        run.train_until(args.stop_at, save_at=(args.stop_at,),
                        save=lambda run: save_checkpoint(run, folder))
        del run  # the DDP model goes before the group does (lesson 02 says why)
        path = folder / f"step-{args.stop_at:06d}.pt"
        saved = load(path, world.device)  # every rank reads it, onto its own device
        size = path.stat().st_size
    torch_rng = [states["torch"].cpu() for states in saved["rng"]]
    mine = {"rng_is_mine": torch.equal(torch_rng[world.rank], torch.get_rng_state()),
            "rng_differs_from_rank_0": not torch.equal(torch_rng[world.rank], torch_rng[0])}
    entries = {"model": {k: list(v.shape) for k, v in saved["model"].items()},
               "optimizer": {"momentum_buffers": len(saved["optimizer"]["state"]),
                             "lr": saved["optimizer"]["param_groups"][0]["lr"]},
               "scheduler": {"last_epoch": saved["scheduler"]["last_epoch"]},
               **{k: saved[k] for k in ("step", "epoch", "step_in_epoch", "steps_per_epoch")},
               "rng": [sorted(states) for states in saved["rng"]]}
    report(args.out, mine, file=path.name, bytes=size, entries=entries,
           loaded_onto=str(next(iter(saved["model"].values())).device), device=str(world.device))
    teardown()


if __name__ == "__main__":
    main()
