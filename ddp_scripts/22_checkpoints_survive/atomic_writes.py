"""Lesson 22, section 6: a crash while saving. The run saves after 1/3 and 2/3 of its
steps, then crashes halfway through writing the last checkpoint: with a plain write it
leaves a truncated file, with save_atomic a .tmp file. Either way, the newest good
checkpoint is found, and resuming from it ends where the uninterrupted run ends. Also:
what torch.load says about files cut at different places.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/22_checkpoints_survive/atomic_writes.py
"""

import io
from pathlib import Path

import torch
import torch.distributed as dist
from checkpoints import capture, load, restore, save_checkpoint, scramble_rngs, shared_folder
from ddp_common import record, report, setup, teardown
from training_run import Run, options, run_length


def latest_good_checkpoint(folder, device, damaged):
    """The newest checkpoint that loads. Damaged ones are listed in `damaged` and
    skipped, never deleted (*.tmp files are unfinished writes: never candidates)."""
    for path in sorted(Path(folder).glob("step-*.pt"), reverse=True):
        try:
            return path, load(path, device)
        except Exception as error:  # a truncated zip, a failed unpickle...
            damaged.append({"file": path.name, "error": f"{type(error).__name__}: {error}"})
            print(f"checkpoint {path} cannot be loaded ({type(error).__name__}: {error}); "
                  f"it is damaged or incomplete (a crash while it was written?). "
                  f"Skipping it, kept for inspection; trying the one before.", flush=True)
    return None, None


def serialized(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def crash_while_saving(args, world, folder, steps, writer):
    """Save at 1/3 and 2/3 of the run, crash while writing the last; resume; compare."""
    run = Run(args, world.rank, world.device)
    run.train_until(steps, save_at=(steps // 3, 2 * steps // 3),
                    save=lambda run: save_checkpoint(run, folder))
    expected, checkpoint = run.weights(), capture(run)
    whole = serialized(checkpoint)
    if world.rank == 0:  # the crash: only the first half of the bytes reaches the disk
        name = f"step-{run.step:06d}.pt" + (".tmp" if writer == "atomic" else "")
        (folder / name).write_bytes(whole[: len(whole) // 2])
    dist.barrier()
    del run, checkpoint
    damaged = []
    path, good = latest_good_checkpoint(folder, world.device, damaged)
    scramble_rngs()
    resumed = Run(args, world.rank, world.device)
    restore(resumed, good)
    resumed.train_until(steps)
    found = {"files": sorted(p.name for p in folder.iterdir()), "resumed_from": path.name,
             "damaged": damaged, "equal": torch.equal(resumed.weights(), expected),
             "max_abs_diff": (resumed.weights() - expected).abs().max().item()}
    del resumed
    return found, whole


def truncation_errors(whole, folder):
    """What torch.load says about a checkpoint cut short at different places (as a crash
    while writing leaves it), and about a 1 MB one cut in half."""
    big = serialized({"weights": torch.zeros(256 * 1024)})  # 1 MB of float32
    cuts = {"empty": whole[:0], "first 2 bytes": whole[:2], "first 10 bytes": whole[:10],
            "half": whole[: len(whole) // 2], "all but the last 10 bytes": whole[:-10],
            "1 MB file, half": big[: len(big) // 2]}
    found = []
    for name, data in cuts.items():
        path = folder / "cut.pt"
        path.write_bytes(data)
        try:
            load(path, torch.device("cpu"))
            error = None
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        found.append({"cut": name, "bytes": len(data), "error": error,
                      "of": len(big if "MB" in name else whole)})
    return found


@record
def main():
    args = options(__doc__).parse_args()
    world = setup(args.device, ddp=True)
    per_epoch, steps = run_length(args)
    truncated, cuts = {}, None
    for writer in ("plain", "atomic"):
        with shared_folder(args.dir and f"{args.dir}/{writer}") as folder:
            truncated[writer], whole = crash_while_saving(args, world, folder, steps, writer)
            if writer == "plain" and world.rank == 0:
                cuts = truncation_errors(whole, folder)
    report(args.out, {}, truncated=truncated, cuts=cuts, steps=steps, stop_at=args.stop_at,
           steps_per_epoch=per_epoch)
    teardown()


if __name__ == "__main__":
    main()
