"""Lesson 04, section 4: resuming equals not stopping, and what breaks it. The run, in one
go, saves a checkpoint after --stop-at steps; each variant starts afresh, restores what it
restores, trains to the end, and is compared with the uninterrupted run.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/04_checkpointing/resume.py
"""

import torch
from checkpoints import RESTORE_ALL, load, restore, save_checkpoint, scramble_rngs, shared_folder
from ddp_common import record, report, setup, teardown
from training_run import Run, options, run_length


def forget_momentum(checkpoint):
    """The optimizer's state without its momentum buffers; each group's lr is kept."""
    checkpoint["optimizer"]["state"] = {}


def forget_lr(checkpoint):
    """The momentum kept; each group's lr back to initial_lr (a fresh optimizer's rate)."""
    for group in checkpoint["optimizer"]["param_groups"]:
        group["lr"] = group["initial_lr"]


VARIANTS = {  # what to restore, and where to go on
    "full": {},
    "no_optimizer_state": {"parts": ("model", "scheduler", "step", "rng")},
    "no_momentum": {"edit": forget_momentum},  # only the momentum buffers lost
    "no_lr": {"edit": forget_lr},  # only the learning rate lost
    "no_scheduler_state": {"parts": ("model", "optimizer", "step", "rng")},
    "no_rng_state": {"parts": ("model", "optimizer", "scheduler", "step")},
    "wrong_step": {"resume_skip": 0},  # restarts the epoch: repeats its batches
    "wrong_epoch": {"resume_epoch": 0},  # epoch 0's shuffle order again
}


def resume_variants(args, world, folder, steps):
    reference = Run(args, world.rank, world.device)  # uninterrupted; saves on its way
    reference.train_until(steps, save_at=(args.stop_at,),
                          save=lambda run: save_checkpoint(run, folder))
    expected = reference.weights()
    path = folder / f"step-{args.stop_at:06d}.pt"
    results = {"checkpoint": path.name, "lrs": {"uninterrupted": reference.lrs[args.stop_at:]},
               "losses": {"uninterrupted": reference.losses}}  # rank 0's, for the figure
    del reference
    for name, how in VARIANTS.items():
        scramble_rngs()
        run = Run(args, world.rank, world.device)
        checkpoint = load(path, world.device)  # every rank reads it, onto its own device
        if "edit" in how:
            how["edit"](checkpoint)
        restore(run, checkpoint, how.get("parts", RESTORE_ALL))
        run.train_until(steps, resume_epoch=how.get("resume_epoch"),
                        resume_skip=how.get("resume_skip"))
        got = run.weights()
        results[name] = {"equal": torch.equal(got, expected),
                         "max_abs_diff": (got - expected).abs().max().item()}
        results["lrs"][name], results["losses"][name] = run.lrs, run.losses
        del run
    results["loaded_onto"] = str(next(iter(checkpoint["model"].values())).device)
    return results


@record
def main():
    args = options(__doc__).parse_args()
    world = setup(args.device, ddp=True)
    per_epoch, steps = run_length(args)
    with shared_folder(args.dir) as folder:
        resume = resume_variants(args, world, folder, steps)
    report(args.out, {v: resume[v]["max_abs_diff"] for v in VARIANTS}, resume=resume,
           steps=steps, stop_at=args.stop_at, steps_per_epoch=per_epoch,
           device=str(world.device))
    teardown()


if __name__ == "__main__":
    main()
