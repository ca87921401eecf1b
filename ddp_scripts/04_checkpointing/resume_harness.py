"""Lesson 04, exercise 3: the DDP training run that ddp_scripts/04_checkpointing/resume_exercise.py
checkpoints and resumes. Not a script of its own: the exercise calls run_exercise() with
its save_checkpoint and load_checkpoint, and gets back what went wrong, if anything.

The run: SGD with momentum and a StepLR schedule, DistributedSampler with set_epoch, 3
epochs. Once uninterrupted; once stopped in the middle of epoch 1, saved, rebuilt from
scratch (other initial weights), loaded, and finished. Both must end bit for bit equal."""

import argparse
import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

saves = []  # the paths this rank handed to torch.save


def slow_disk(save, seconds):
    """torch.save on a busy shared file system: it waits `seconds` before it writes (so a
    rank that does not wait for the file finds nothing), and it counts the calls."""
    def slow_save(obj, f, *args, **kwargs):
        saves.append(str(f))
        time.sleep(seconds)
        return save(obj, f, *args, **kwargs)
    return slow_save


def make_run(seed):
    torch.manual_seed(seed)  # the same initial weights on every rank
    # One tensor: DDP's bucket has one layout, so a fresh model sums the gradients over
    # the ranks in the same order as the uninterrupted run's, at any world size (section 4).
    model = DDP(torch.nn.Linear(8, 3, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    return model, optimizer, scheduler


def make_loader(batch=4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    data = TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long())
    sampler = DistributedSampler(data, seed=0)
    return sampler, DataLoader(data, batch_size=batch, sampler=sampler)


def train(model, optimizer, scheduler, sampler, loader, step, last_step):
    """Optimizer steps `step` to `last_step`: the epoch and the batches already done in
    it follow from `step`, so a resumed run sees the batches the uninterrupted one saw."""
    while step < last_step:
        epoch, skip = divmod(step, len(loader))
        sampler.set_epoch(epoch)
        for x, y in itertools.islice(loader, skip, None):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == last_step:
                break
    return step


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.module.parameters()])


def experiment(save_checkpoint, load_checkpoint, folder):
    rank = dist.get_rank()
    sampler, loader = make_loader()
    stop_at, last_step = len(loader) + len(loader) // 2, 3 * len(loader)
    model, optimizer, scheduler = make_run(seed=0)
    train(model, optimizer, scheduler, sampler, loader, 0, last_step)
    expected = weights(model)
    model, optimizer, scheduler = make_run(seed=0)  # the run that will be interrupted
    train(model, optimizer, scheduler, sampler, loader, 0, stop_at)
    path = folder / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, scheduler, stop_at)
    try:  # what this rank finds the moment save_checkpoint returns
        complete = torch.load(path, weights_only=True) is not None
    except Exception:  # no file yet, or a partial one
        complete = False
    dist.barrier()
    files = sorted(p.name for p in folder.iterdir())
    model, optimizer, scheduler = make_run(seed=1)  # a new process: other weights ...
    torch.manual_seed(1234)  # ... and other random numbers
    step = load_checkpoint(path, model, optimizer, scheduler)
    train(model, optimizer, scheduler, sampler, loader, step, last_step)
    got = weights(model)
    problems = []
    if len(saves) != (rank == 0):
        problems.append(f"rank {rank} called torch.save {len(saves)} times: only rank 0 "
                        f"writes the checkpoint (every rank holds the same weights)")
    if not complete:
        problems.append(f"rank {rank} found no complete {path.name} when save_checkpoint "
                        f"returned: the other ranks must wait until rank 0 has written it")
    if files != ["checkpoint.pt"]:
        problems.append(f"the folder holds {files}, not only checkpoint.pt")
    if step != stop_at:
        problems.append(f"rank {rank}: load_checkpoint returned step {step}, not {stop_at}")
    if not torch.equal(got, expected):
        problems.append(f"rank {rank}: the resumed weights differ from the uninterrupted "
                        f"run's by up to {(got - expected).abs().max().item():.3g}")
    return {"rank": rank, "steps": last_step, "stop_at": stop_at, "problems": problems}


@record
def run_exercise(save_checkpoint, load_checkpoint):
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--slow-disk", type=float, default=0.5,
                        help="seconds each torch.save waits before it writes")
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds a collective waits, then Gloo gives up")
    parser.add_argument("--out", help="rank 0 writes what every rank found here, as JSON")
    args = parser.parse_args()
    setup("cpu", timeout_s=args.timeout, ddp=True)  # lesson 02; CPU and Gloo: the files
    torch.save = slow_disk(torch.save, args.slow_disk)
    rank = dist.get_rank()
    folder = [tempfile.mkdtemp(prefix="ddp-course-07-exercise-") if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)  # every rank uses rank 0's folder
    report(args.out, experiment(save_checkpoint, load_checkpoint, Path(folder[0])))
    if rank == 0:
        shutil.rmtree(folder[0])
    teardown()
