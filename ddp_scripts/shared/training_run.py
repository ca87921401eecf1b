"""Lesson 04: the DDP training run that the lesson's scripts checkpoint and resume, with
all that makes resuming hard. Run on its own, it trains once and reports:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/shared/training_run.py
"""

import itertools
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES = 64  # 4 steps per epoch on 2 ranks with a batch of 8 per rank


def options(doc):
    parser = arguments(doc)
    parser.add_argument("--epochs", type=int, default=3, help="length of the whole run")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="steps before the checkpoint (default: mid-epoch 1)")
    parser.add_argument("--batch", type=int, default=8, help="batch per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one-tensor", action="store_true", help="one parameter tensor")
    parser.add_argument("--dir", help="checkpoint folder that every rank sees")
    return parser


def make_model(one_tensor=False):
    if one_tensor:  # one tensor: one way to lay it out in DDP's buckets
        return nn.Sequential(nn.Dropout(0.2), nn.Linear(8, 3, bias=False))
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))


def make_dataset(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long())


def make_loader(args, data=None, **loader_options):
    """This rank's sampler and loader, which has a generator of its own (section 1)."""
    data = make_dataset(args.seed) if data is None else data
    sampler = DistributedSampler(data, seed=args.seed)
    return sampler, DataLoader(data, batch_size=args.batch, sampler=sampler,
                               generator=torch.Generator().manual_seed(args.seed),
                               **loader_options)


def run_length(args):
    """Steps per epoch and in the whole run; --stop-at defaults to mid-epoch 1."""
    per_epoch = len(make_loader(args)[1])
    steps = args.epochs * per_epoch
    if args.stop_at is None:
        args.stop_at = per_epoch + per_epoch // 2
    if not 0 < args.stop_at < steps:
        sys.exit(f"--stop-at must be between 1 and {steps - 1} (the run has {steps} steps)")
    return per_epoch, steps


def epoch_seed(seed, rank, epoch):
    """A seed for this rank's loader in this epoch: its workers' seeds then follow from
    (seed, rank, epoch), however the run got to this epoch (lesson 22, section 5)."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1, np.uint64)[0])

def loader_draws(args):
    """Does starting an epoch (iter(loader), no workers) move torch's global generator?"""
    data, found = make_dataset(args.seed), {}
    for name, generator in (("without_generator", None),
                            ("with_generator", torch.Generator().manual_seed(0))):
        before = torch.get_rng_state()
        iter(DataLoader(data, batch_size=args.batch, generator=generator))
        found[name] = not torch.equal(before, torch.get_rng_state())
    return found


class Run:
    """One rank's part of the run. loader: (sampler, loader), if not make_loader's."""

    def __init__(self, args, rank, device, loader=None, seed_loader_per_epoch=True):
        self.args, self.rank, self.device = args, rank, device
        self.seed_loader_per_epoch = seed_loader_per_epoch
        torch.manual_seed(args.seed)  # the same initial weights everywhere ...
        self.ddp = DDP(make_model(args.one_tensor).to(device),
                       device_ids=[device.index] if device.type == "cuda" else None)
        random.seed(args.seed + rank)  # ... but each rank its own random stream
        np.random.seed(args.seed + rank)
        torch.manual_seed(args.seed + rank)
        self.sampler, self.loader = loader or make_loader(args)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(  # halve the lr every epoch
            self.optimizer, step_size=len(self.loader), gamma=0.5)
        self.step = 0  # optimizer steps done so far
        self.lrs, self.losses = [], []  # each step's rate, and this rank's loss
        self.loader_seeds = {}  # epoch -> the base seed of its workers (lesson 22)

    def train_until(self, last_step, save_at=(), save=None, resume_epoch=None,
                    resume_skip=None):
        """Train until `last_step` steps are done, calling save(self) after each step in
        `save_at`; resume_epoch, resume_skip: a wrong position (section 4)."""
        per_epoch, first = len(self.loader), True
        while self.step < last_step:
            epoch, skip = divmod(self.step, per_epoch)
            if first:
                epoch = epoch if resume_epoch is None else resume_epoch
                skip = skip if resume_skip is None else resume_skip
                first = False
            self.sampler.set_epoch(epoch)  # the shuffle order of this epoch
            if self.seed_loader_per_epoch:  # the seeds of this epoch's workers
                self.loader.generator.manual_seed(epoch_seed(self.args.seed, self.rank, epoch))
            # islice fetches the skipped batches (workers draw for them) and drops them
            for x, y, *worker_seed in itertools.islice(self.loader, skip, None):
                self.loader_seeds[epoch] = worker_seed[0] if worker_seed else None
                self.train_step(x, y)
                if self.step in save_at:
                    save(self)
                if self.step == last_step:
                    break

    def train_step(self, x, y):
        x = x + 0.05 * torch.from_numpy(np.random.randn(*x.shape)).float()  # numpy's RNG
        x = x * random.uniform(0.9, 1.1)  # python's RNG
        self.lrs.append(self.optimizer.param_groups[0]["lr"])  # what this step uses
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.ddp(x.to(self.device)), y.to(self.device))
        loss.backward()  # the dropout in the forward pass used torch's RNG
        self.losses.append(loss.item())
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1

    def weights(self):
        return torch.cat([p.detach().flatten().cpu() for p in self.ddp.module.parameters()])



@record
def main():
    args = options(__doc__).parse_args()
    world = setup(args.device, ddp=True)
    per_epoch, steps = run_length(args)
    draws = loader_draws(args)
    run = Run(args, world.rank, world.device)
    run.train_until(steps)
    mine = {"losses": run.losses, "lrs": run.lrs, "weights": run.weights().tolist()}
    del run  # the DDP model goes before the group does (lesson 02 says why)
    report(args.out, mine, steps=steps, steps_per_epoch=per_epoch, stop_at=args.stop_at,
           loader_draws=draws)
    teardown()


if __name__ == "__main__":
    main()
