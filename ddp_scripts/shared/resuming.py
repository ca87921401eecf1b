"""Lesson 23: lesson 04's training run, made small, resuming exactly from its newest
checkpoint (fault_tolerance.py imports it). Run on its own, it trains 6 steps with a
checkpoint at step 4, stops, resumes in a new Run and compares the weights at step 6:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/shared/resuming.py
"""

import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 8, generator=g)
    return TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long())


class Run:
    """Model, optimizer, data and position; each rank has its own dropout stream."""

    def __init__(self, seed, rank, device, batch):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
        self.ddp = DDP(model.to(device),
                       device_ids=[device.index] if device.type == "cuda" else None)
        torch.manual_seed(seed + 1 + rank)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        data = make_dataset(seed)
        self.sampler = DistributedSampler(data, seed=seed)
        self.loader = DataLoader(data, batch_size=batch, sampler=self.sampler,
                                 generator=torch.Generator().manual_seed(seed))
        self.rank, self.device, self.step = rank, device, 0

    def batches(self):
        """(x, y) for the steps still to do, starting where self.step says."""
        while True:
            epoch, skip = divmod(self.step, len(self.loader))
            self.sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(self.loader):
                if i >= skip:
                    yield x, y

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        F.cross_entropy(self.ddp(x.to(self.device)), y.to(self.device)).backward()
        self.optimizer.step()
        self.step += 1

    def state(self):
        """Everything this loop depends on; the random state is each rank's own (dropout)."""
        mine = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":  # dropout on a GPU draws from the GPU's generator
            mine["cuda"] = torch.cuda.get_rng_state(self.device)
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, mine)  # a collective: every rank calls it
        return {"model": self.ddp.module.state_dict(),
                "optimizer": self.optimizer.state_dict(), "step": self.step, "rng": rngs}

    def load(self, checkpoint):
        self.ddp.module.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.step = checkpoint["step"]
        mine = checkpoint["rng"][self.rank]
        torch.set_rng_state(mine["cpu"].cpu())  # map_location may have moved it
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(mine["cuda"].cpu(), self.device)

    def weights(self):
        return torch.cat([p.detach().flatten().cpu() for p in self.ddp.module.parameters()])


def save_atomic(obj, path):
    """Temporary file, flush, fsync, rename, fsync the folder (lesson 22)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def newest_checkpoint(folder, device, rank):
    """Rank 0 picks the newest checkpoint that loads and tells the others, so that all
    ranks resume from the same one even if their views of the folder differ."""
    choice, checkpoint = [None], None
    if rank == 0:
        for path in sorted(Path(folder).glob("step-*.pt"), reverse=True):
            try:
                checkpoint = torch.load(path, map_location=device, weights_only=True)
                choice = [path.name]
                break
            except Exception as error:
                print(f"skipping damaged checkpoint {path}: {error!r}", flush=True)
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return None, None
    path = Path(folder) / choice[0]
    if checkpoint is None:  # the other ranks load the one rank 0 chose
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    return path, checkpoint


def train(run, steps, every, folder, after_step=lambda step: None):
    """Train to step `steps`, saving every `every` steps; then after_step(step) each step."""
    batches = run.batches()
    while run.step < steps:
        run.train_step(*next(batches))
        if run.step % every == 0:
            state = run.state()  # a collective: every rank calls it
            if run.rank == 0:
                save_atomic(state, Path(folder) / f"step-{run.step:06d}.pt")
            dist.barrier()  # the checkpoint is complete before anyone goes on
        after_step(run.step)


@record
def main():
    args = arguments(__doc__).parse_args()  # --device, --out (lesson 02)
    world = setup(args.device, ddp=True)  # ddp=True: lesson 13, "A clean exit"
    folder = Path(tempfile.gettempdir()) / f"ddp-course-08-{os.environ['TORCHELASTIC_RUN_ID']}"
    folder.mkdir(exist_ok=True)
    first = Run(0, world.rank, world.device, batch=8)
    train(first, 6, 4, folder)  # a checkpoint at step 4, then steps 5 and 6
    weights = first.weights()
    del first  # the job stops: only the checkpoint is left
    path, checkpoint = newest_checkpoint(folder, world.device, world.rank)
    run = Run(0, world.rank, world.device, batch=8)
    run.load(checkpoint)
    train(run, 6, 4, folder)  # steps 5 and 6 again
    report(args.out, {"max_abs_diff": (run.weights() - weights).abs().max().item()},
           resumed_from=path.name)
    del run
    if world.rank == 0:
        shutil.rmtree(folder)
    teardown()


if __name__ == "__main__":
    main()
