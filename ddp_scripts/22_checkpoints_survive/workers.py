"""Lesson 22, section 5: augmentation in DataLoader worker processes (--workers per rank),
whose generators no checkpoint holds. The full resume of section 4 with the loader's
generator seeded once, then reseeded every epoch from (seed, rank, epoch), then without
workers; and the seeds of persistent workers.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/22_checkpoints_survive/workers.py
"""

import multiprocessing

import torch
import torch.distributed as dist
from checkpoints import load, restore, save_checkpoint, scramble_rngs, shared_folder
from ddp_common import record, report, setup, teardown
from torch.utils.data import Dataset, default_collate, get_worker_info
from training_run import Run, epoch_seed, make_dataset, make_loader, options, run_length


class Augmented(Dataset):
    """The samples with noise added as they are loaded, drawn from torch's global generator
    of the process that loads them: a worker (seeded with base_seed + worker id), or
    the rank itself without workers."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        x, y = self.data[index]
        return x + 0.1 * torch.randn(x.shape), y


def collate_with_seed(samples):
    """The batch, and the base seed of the worker that made it (None without workers)."""
    info = get_worker_info()  # None in the main process
    return (*default_collate(samples), None if info is None else info.seed - info.id)


# What a worker imports when it runs this script's top level again (to find Augmented):
# the forkserver imports them once, so each worker forked from it starts at once. It
# skips a name it cannot import, silently: keep them spelled right.
WORKER_MODULES = ["numpy", "torch", "ddp_common", "training_run", "checkpoints"]


def augmented_loader(args, workers, persistent=False):
    """make_loader's, on Augmented data, with workers started from a forkserver, not by
    fork() of this rank and its Gloo threads."""
    if workers:
        multiprocessing.set_forkserver_preload(WORKER_MODULES)
    return make_loader(args, Augmented(make_dataset(args.seed)), num_workers=workers,
                       persistent_workers=persistent, collate_fn=collate_with_seed,
                       multiprocessing_context="forkserver" if workers else None)


def resume_with_workers(args, world, folder, steps, workers, per_epoch):
    """Train in one go, saving at --stop-at; resume from there; compare."""
    reference = Run(args, world.rank, world.device, augmented_loader(args, workers), per_epoch)
    reference.train_until(steps, save_at=(args.stop_at,),
                          save=lambda run: save_checkpoint(run, folder))
    scramble_rngs()
    resumed = Run(args, world.rank, world.device, augmented_loader(args, workers), per_epoch)
    restore(resumed, load(folder / f"step-{args.stop_at:06d}.pt", world.device))
    resumed.train_until(steps)
    seeds = [None] * dist.get_world_size()  # every rank's seeds in each epoch
    dist.all_gather_object(seeds, reference.loader_seeds)
    found = {"equal": torch.equal(resumed.weights(), reference.weights()),
             "max_abs_diff": (resumed.weights() - reference.weights()).abs().max().item(),
             "seeds_uninterrupted": reference.loader_seeds,
             "seeds_resumed": resumed.loader_seeds, "seeds_every_rank": seeds}
    del reference, resumed
    return found


def persistent_seeds(args, rank, resumed_epoch):
    """Persistent workers live as long as their loader: their seed is drawn at its first
    iter(). Reseeded before each of 3 epochs; then a resumed run's new loader."""
    _, loader = augmented_loader(args, workers=1, persistent=True)
    seeds = []
    for epoch in range(3):
        loader.generator.manual_seed(epoch_seed(args.seed, rank, epoch))
        seeds.append(next(iter(loader))[2])
    del loader
    _, loader = augmented_loader(args, workers=1, persistent=True)
    loader.generator.manual_seed(epoch_seed(args.seed, rank, resumed_epoch))
    return seeds, next(iter(loader))[2]


@record
def main():
    parser = options(__doc__)
    parser.add_argument("--workers", type=int, default=1,
                        help="DataLoader worker processes per rank (each costs a process "
                             "start per epoch)")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)
    per_epoch, steps = run_length(args)
    found = {"workers": args.workers}
    cases = {"seeded_once": (args.workers, False), "seeded_per_epoch": (args.workers, True),
             "in_the_rank": (0, True)}
    for case, (workers, reseed) in cases.items():
        with shared_folder(args.dir and f"{args.dir}/{case}") as folder:
            found[case] = resume_with_workers(args, world, folder, steps, workers, reseed)
    found["persistent_seeds"], found["persistent_resumed_seed"] = persistent_seeds(
        args, world.rank, args.stop_at // per_epoch)
    report(args.out, {}, **found, steps=steps, stop_at=args.stop_at,
           steps_per_epoch=per_epoch)
    teardown()


if __name__ == "__main__":
    main()
