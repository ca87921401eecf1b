"""Lesson 07: checkpointing DDP training, and resuming it exactly.

With defaults it runs these experiments and rank 0 writes what it found as JSON:

1. the `module.` prefix: what a DDP state_dict looks like and how to load it;
2. resume equals uninterrupted: train --epochs epochs in one go, saving a checkpoint
   after --stop-at steps on the way; then, in a fresh state, load it and finish;
   compare;
3. what breaks resuming: no optimizer state (and its two halves: the momentum
   buffers, the learning rate), no scheduler state, no RNG states, the wrong step,
   the wrong epoch (each compared with the uninterrupted run);
3b. DataLoader workers (--workers) with random augmentation: a resume that is not
   exact, and one that is (each epoch's worker seeds follow from seed, rank, epoch);
4. atomic writes: a checkpoint truncated on purpose is detected and the previous
   good one is used; what torch.load says for files cut at different places;
5. safe loading: weights_only=True refuses a file that runs code when unpickled;
6. a sharded checkpoint with torch.distributed.checkpoint (DCP), saved from every
   rank. With --dcp-load DIR, the script instead loads such a checkpoint into
   however many ranks it was started with, and checks every value.

Checkpoints go to --dir, which every rank must see (on several nodes: a shared
file system). By default rank 0 makes a temporary folder and removes it at the end.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/07_checkpointing.py
"""

import argparse
import io
import itertools
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, require_torchrun, setup, teardown
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

SAMPLES = 64  # 4 steps per epoch on 2 ranks with a batch of 8 per rank


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="length of the whole run")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="the checkpoint to resume from is saved after this many "
                             "steps (default: in the middle of the second epoch)")
    parser.add_argument("--batch", type=int, default=8, help="batch per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1,
                        help="DataLoader worker processes per rank in experiment 3b "
                             "(each costs a process start per epoch; 0 skips 3b)")
    parser.add_argument("--one-tensor", action="store_true",
                        help="train a model whose parameters are a single tensor")
    parser.add_argument("--dir", help="checkpoint folder shared by all ranks")
    parser.add_argument("--dcp-load", metavar="DIR",
                        help="only load the DCP checkpoint in DIR and check it")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


# The training run: everything a checkpoint must capture -----------------------------

def make_model(one_tensor=False):
    if one_tensor:  # DDP has only one way to lay this out in its bucket
        return nn.Sequential(nn.Dropout(0.2), nn.Linear(8, 3, bias=False))
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))


def make_dataset(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long())


class Augmented(Dataset):
    """The samples with random noise added as they are loaded (experiment 3b), drawn
    from torch's global generator of the process that loads them: each worker
    process (seeded with base_seed + worker id), or the rank itself without workers."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        x, y = self.data[index]
        return x + 0.1 * torch.randn(x.shape), y


def collate_with_seed(samples):
    """The batch, and the base seed of the worker that made it (None without workers):
    worker i of an epoch is seeded with base_seed + i."""
    info = torch.utils.data.get_worker_info()  # None in the main process
    base_seed = None if info is None else info.seed - info.id
    return (*torch.utils.data.default_collate(samples), base_seed)


# The heavy imports a worker meets when it runs this script's top level again (to find
# Augmented): the forkserver imports them once, so each worker forked from it starts at
# once. The forkserver skips a name it cannot import, silently: keep them spelled right.
# (torch._dynamo is not among them: setup(ddp=True) imports it in main(), which the
# workers do not run.)
WORKER_MODULES = ["numpy", "torch", "torch.distributed.checkpoint",
                  "torch.distributed.tensor"]


def make_loader(args, augment=False, workers=0, persistent=False):
    """This rank's sampler and loader. The loader gets a generator of its own:
    otherwise every iter(loader) draws from the global torch RNG. Its workers, if
    any, come from a forkserver, not from fork() of this rank and its threads."""
    data = make_dataset(args.seed)
    if augment:
        data = Augmented(data)
    sampler = DistributedSampler(data, seed=args.seed)
    if workers:
        multiprocessing.set_forkserver_preload(WORKER_MODULES)
    return sampler, DataLoader(data, batch_size=args.batch, sampler=sampler,
                               num_workers=workers, persistent_workers=persistent,
                               multiprocessing_context="forkserver" if workers else None,
                               collate_fn=collate_with_seed,
                               generator=torch.Generator().manual_seed(args.seed))


def epoch_seed(seed, rank, epoch):
    """A seed for this rank's loader in this epoch: the workers' seeds then follow
    from (seed, rank, epoch), however the run got to this epoch."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1, np.uint64)[0])


class Run:
    """A DDP training run: model, optimizer, scheduler, sampler, loader, position and
    the random number generators. Each rank seeds its RNGs differently (its dropout
    masks and augmentation differ), so each rank's RNG states must be saved.
    With seed_loader_per_epoch, the loader's generator is reseeded at the start of
    every epoch from (seed, rank, epoch), as set_epoch does for the sampler."""

    def __init__(self, args, rank, device, augment=False, workers=0,
                 seed_loader_per_epoch=True):
        self.args, self.rank, self.device = args, rank, device
        self.seed_loader_per_epoch = seed_loader_per_epoch
        torch.manual_seed(args.seed)  # the same initial weights everywhere ...
        self.ddp = DDP(make_model(args.one_tensor).to(device),
                       device_ids=[device.index] if device.type == "cuda" else None)
        random.seed(args.seed + rank)  # ... but each rank its own random stream
        np.random.seed(args.seed + rank)
        torch.manual_seed(args.seed + rank)
        self.sampler, self.loader = make_loader(args, augment, workers)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(  # halve the lr every epoch
            self.optimizer, step_size=len(self.loader), gamma=0.5)
        self.step = 0  # optimizer steps done so far
        self.lrs = []  # the learning rate of each step this object took
        self.losses = []  # this rank's loss at each step this object took
        self.loader_seeds = {}  # epoch -> the base seed of its workers

    def train_until(self, last_step, resume_epoch=None, resume_skip=None, save_at=(),
                    folder=None):
        """Train until `last_step` optimizer steps are done, saving a checkpoint into
        `folder` after each step in `save_at`. Where in the data to go on follows from
        self.step; resume_epoch and resume_skip override it for the first epoch (to
        show what goes wrong when they are not what they should be)."""
        per_epoch = len(self.loader)
        first = True
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
            for x, y, loader_seed in itertools.islice(self.loader, skip, None):
                self.loader_seeds[epoch] = loader_seed
                self.train_step(x, y)
                if self.step in save_at:
                    save_checkpoint(self, folder)
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


# Saving and loading safely ----------------------------------------------------------

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


def latest_good_checkpoint(folder, device, report):
    """The newest checkpoint that loads. Damaged ones are reported and skipped, never
    deleted (*.tmp files are unfinished writes and are never candidates)."""
    for path in sorted(Path(folder).glob("step-*.pt"), reverse=True):
        try:
            return path, load(path, device)
        except Exception as error:  # a truncated zip, a failed unpickle...
            report.append({"file": path.name, "error": f"{type(error).__name__}: {error}"})
            print(f"checkpoint {path} cannot be loaded ({type(error).__name__}: {error}); "
                  f"it is damaged or incomplete (a crash while it was written?). "
                  f"Skipping it, kept for inspection; trying the one before.", flush=True)
    return None, None


# The experiments ----------------------------------------------------------------------

def module_prefix(device):
    ddp = DDP(make_model().to(device),
              device_ids=[device.index] if device.type == "cuda" else None)
    wrapped = ddp.state_dict()
    plain = make_model().to(device)
    try:
        plain.load_state_dict(wrapped)
        error = None
    except RuntimeError as e:
        error = str(e)

    def loads(state_dict):  # every key matches, none missing, none left over
        result = plain.load_state_dict(state_dict, strict=False)
        return not (result.missing_keys or result.unexpected_keys)

    stripped = dict(wrapped)
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    inner_loads, stripped_loads = loads(ddp.module.state_dict()), loads(stripped)
    return {"ddp_keys": list(wrapped), "module_keys": list(ddp.module.state_dict()),
            "error": error, "wrapped_loads": loads(wrapped),
            "module_state_dict_loads": inner_loads,
            "stripped_loads": stripped_loads}


def scramble_rngs():
    """What a new process would have: random states that have nothing to do with ours."""
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)


def forget_momentum(checkpoint):
    """The optimizer's state without its momentum buffers; each group's lr is kept."""
    checkpoint["optimizer"]["state"] = {}


def forget_lr(checkpoint):
    """The momentum buffers kept, but each group's lr back to the initial one (what a
    freshly built optimizer has: StepLR stored it in the group as initial_lr)."""
    for group in checkpoint["optimizer"]["param_groups"]:
        group["lr"] = group["initial_lr"]


def resume_experiments(args, rank, device, folder, steps):
    reference = Run(args, rank, device)  # the uninterrupted run, which saves on its way
    reference.train_until(steps, save_at=(args.stop_at,), folder=folder)
    expected, expected_lrs = reference.weights(), reference.lrs[args.stop_at:]
    path = Path(folder) / f"step-{args.stop_at:06d}.pt"
    results = {"checkpoint": path.name, "lrs": {"uninterrupted": expected_lrs},
               "losses": {"uninterrupted": reference.losses}}  # rank 0's, for the figure
    del reference
    variants = {  # what to restore, and where to go on
        "full": {},
        "no_optimizer_state": {"parts": ("model", "scheduler", "step", "rng")},
        "no_momentum": {"edit": forget_momentum},  # only the momentum buffers lost
        "no_lr": {"edit": forget_lr},  # only the learning rate lost
        "no_scheduler_state": {"parts": ("model", "optimizer", "step", "rng")},
        "no_rng_state": {"parts": ("model", "optimizer", "scheduler", "step")},
        "wrong_step": {"resume_skip": 0},  # restarts the epoch: repeats its batches
        "wrong_epoch": {"resume_epoch": 0},  # epoch 0's shuffle order again
    }
    for name, how in variants.items():
        scramble_rngs()
        run = Run(args, rank, device)
        checkpoint = load(path, device)  # every rank reads it, onto its own device
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
    return results, expected


def loader_draws(args):
    """Does starting to iterate over a DataLoader (no workers) move torch's global
    generator? Without a generator of its own, and with one."""
    data = make_dataset(args.seed)
    found = {}
    for name, generator in (("without_generator", None),
                            ("with_generator", torch.Generator().manual_seed(0))):
        before = torch.get_rng_state()
        iter(DataLoader(data, batch_size=args.batch, generator=generator))
        found[name] = not torch.equal(before, torch.get_rng_state())
    return found


def workers_experiment(args, rank, device, folder, steps):
    """Augmentation while loading, in --workers DataLoader workers. The same resume as
    in experiment 3 (everything restored), with the loader's generator seeded once when
    the loader is made, then reseeded every epoch from (seed, rank, epoch); and the
    same augmentation without workers, in the rank itself."""
    found = {"workers": args.workers}
    cases = {"seeded_once": (args.workers, False), "seeded_per_epoch": (args.workers, True),
             "in_the_rank": (0, True)}
    for case, (workers, per_epoch) in cases.items():
        where = Path(folder) / f"augmented-{case}"
        if rank == 0:
            where.mkdir()
        dist.barrier()
        reference = Run(args, rank, device, True, workers, per_epoch)
        reference.train_until(steps, save_at=(args.stop_at,), folder=where)
        expected = reference.weights()
        scramble_rngs()
        resumed = Run(args, rank, device, True, workers, per_epoch)
        restore(resumed, load(where / f"step-{args.stop_at:06d}.pt", device))
        resumed.train_until(steps)
        seeds = [None] * dist.get_world_size()  # every rank's seeds in each epoch
        dist.all_gather_object(seeds, reference.loader_seeds)
        found[case] = {"equal": torch.equal(resumed.weights(), expected),
                         "max_abs_diff": (resumed.weights() - expected).abs().max().item(),
                         "seeds_uninterrupted": reference.loader_seeds,
                         "seeds_resumed": resumed.loader_seeds,
                         "seeds_every_rank": seeds}
        del reference, resumed
    # persistent workers live as long as the loader: seeded once, at its first iter()
    _, loader = make_loader(args, augment=True, workers=1, persistent=True)
    seeds = []
    for epoch in range(3):
        loader.generator.manual_seed(epoch_seed(args.seed, rank, epoch))
        seeds.append(next(iter(loader))[2])
    found["persistent_seeds"] = seeds
    del loader
    # a resumed run makes a new persistent loader, first iterated in the resumed epoch
    _, loader = make_loader(args, augment=True, workers=1, persistent=True)
    loader.generator.manual_seed(epoch_seed(args.seed, rank, args.stop_at // len(loader)))
    found["persistent_resumed_seed"] = next(iter(loader))[2]
    del loader
    return found


def truncated_checkpoint(args, rank, device, folder, steps, expected):
    """Checkpoints after 1/3 and 2/3 of the run, then a crash while writing the last
    one: with a plain write it leaves a truncated file; with save_atomic, a .tmp file.
    Either way, the newest good checkpoint is found, and resuming from it still ends
    exactly where the uninterrupted run ended. Rank 0 also returns truncation_errors."""
    found, cuts = {}, None
    for writer in ("plain", "atomic"):
        where = Path(folder) / writer
        if rank == 0:
            where.mkdir()
        dist.barrier()
        run = Run(args, rank, device)
        run.train_until(steps, save_at=(steps // 3, 2 * steps // 3), folder=where)
        checkpoint = capture(run)
        if rank == 0:  # the crash: only the first half of the bytes reaches the disk
            whole = serialized(checkpoint)
            name = f"step-{run.step:06d}.pt" + (".tmp" if writer == "atomic" else "")
            (where / name).write_bytes(whole[: len(whole) // 2])
            if writer == "plain":
                cuts = truncation_errors(whole, Path(folder) / "cuts")
        dist.barrier()
        del run, checkpoint
        damaged = []
        path, good = latest_good_checkpoint(where, device, damaged)
        scramble_rngs()
        resumed = Run(args, rank, device)
        restore(resumed, good)
        resumed.train_until(steps)
        found[writer] = {"files": sorted(p.name for p in where.iterdir()),
                         "resumed_from": path.name, "damaged": damaged,
                         "equal": torch.equal(resumed.weights(), expected),
                         "max_abs_diff": (resumed.weights() - expected).abs().max().item()}
        del resumed
    return found, cuts


def serialized(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def truncation_errors(whole, folder):
    """What torch.load says about a checkpoint cut short at different places (as a
    crash while writing leaves it), and about a 1 MB one cut in half."""
    folder.mkdir()
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
        found.append({"cut": name, "bytes": len(data), "of": len(whole if "MB" not in name
                                                                  else big), "error": error})
    return found


class RunsCodeWhenLoaded:
    """A pickle can name any function to call when it is loaded. This one names
    open(marker, "w"): harmless, but it proves that loading ran code of our choosing."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def safe_loading(folder):
    """Rank 0 alone: a crafted file against weights_only=True and False."""
    folder = Path(folder)
    crafted, marker = folder / "crafted.pt", folder / "code-ran-here.txt"
    torch.save({"weights": torch.ones(2), "extra": RunsCodeWhenLoaded(marker)}, crafted)
    found = {}
    try:
        torch.load(crafted, weights_only=True)
        found["weights_only_error"] = None
    except Exception as error:
        found["weights_only_error"] = f"{type(error).__name__}: {error}"
    found["code_ran_with_weights_only"] = marker.exists()
    loaded = torch.load(crafted, weights_only=False)  # only ever do this to a file you made
    loaded["extra"].close()  # it is the file object that open() returned
    found["code_ran_without_weights_only"] = marker.exists()
    numpy_state = folder / "numpy-state.pt"
    torch.save({"numpy_rng": np.random.get_state()}, numpy_state)
    try:
        torch.load(numpy_state, weights_only=True)
        found["numpy_error"] = None
    except Exception as error:
        found["numpy_error"] = f"{type(error).__name__}: {error}"
    return found


# Sharded checkpoints with torch.distributed.checkpoint -------------------------------

TABLE_ROWS = 12  # divisible by 1, 2, 3, 4 and 6 ranks


def full_table():
    return torch.arange(TABLE_ROWS * 4, dtype=torch.float32).reshape(TABLE_ROWS, 4)


def dcp_save(args, rank, device, folder):
    """Every rank writes its own part: a table sharded by rows (a DTensor, as FSDP or
    tensor parallelism would give), and the model. A plain torch.save of the same
    model goes next to it, to compare with after loading."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    table = distribute_tensor(full_table().to(device), mesh, [Shard(0)])
    run = Run(args, rank, device)
    run.train_until(2)
    model = run.ddp.module.state_dict()
    dcp.save({"table": table, "model": model}, checkpoint_id=Path(folder) / "dcp")
    if rank == 0:
        save_atomic(model, Path(folder) / "model.pt")
    dist.barrier()
    return {"folder": str(Path(folder) / "dcp"),
            "files": sorted(os.listdir(Path(folder) / "dcp")),
            "rows_per_rank": table.to_local().shape[0]}


def dcp_load(folder, rank, device):
    """Load a DCP checkpoint into however many ranks this job has."""
    folder = Path(folder)
    world_size = dist.get_world_size()
    if TABLE_ROWS % world_size:
        sys.exit(f"{world_size} ranks cannot share {TABLE_ROWS} rows evenly")
    mesh = init_device_mesh(device.type, (world_size,))
    table = distribute_tensor(torch.zeros(TABLE_ROWS, 4, device=device), mesh, [Shard(0)])
    model = {k: torch.zeros_like(v) for k, v in make_model().to(device).state_dict().items()}
    dcp.load({"table": table, "model": model}, checkpoint_id=folder)  # fills in place
    reference = load(folder.parent / "model.pt", device)
    local = table.to_local()
    mine = {"rank": rank, "rows": local.shape[0],
            "first_value": local[0, 0].item(),
            "rows_right": torch.equal(local.cpu(), full_table()[rank * local.shape[0]:]
                                      [:local.shape[0]])}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return {"world_size": world_size, "ranks": everyone,
            "table_equal": torch.equal(table.full_tensor().cpu(), full_table()),
            "model_equal": all(torch.equal(model[k], reference[k]) for k in reference)}


@record
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    device = setup(ddp=True).device  # lesson 01: checks, device, process group
    if args.dcp_load:
        found = dcp_load(args.dcp_load, rank, device)
    else:
        found = experiments(args, rank, device)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(found, f)
    teardown()


def experiments(args, rank, device):
    per_epoch = len(make_loader(args)[1])
    steps = args.epochs * per_epoch
    if args.stop_at is None:
        args.stop_at = per_epoch + per_epoch // 2
    if not 0 < args.stop_at < steps:
        sys.exit(f"--stop-at must be between 1 and {steps - 1} (the run has {steps} steps)")
    temporary = args.dir is None
    folder = [tempfile.mkdtemp(prefix="ddp-course-07-") if temporary and rank == 0
              else args.dir]
    dist.broadcast_object_list(folder, src=0)  # everyone uses rank 0's folder
    folder = Path(folder[0])
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    found = {"world_size": dist.get_world_size(), "steps": steps, "stop_at": args.stop_at,
             "steps_per_epoch": per_epoch, "device": str(device),
             "prefix": module_prefix(device), "loader_draws": loader_draws(args)}
    found["resume"], expected = resume_experiments(args, rank, device, folder, steps)
    if args.workers > 0:
        found["workers"] = workers_experiment(args, rank, device, folder, steps)
    found["truncated"], found["cuts"] = truncated_checkpoint(args, rank, device, folder, steps,
                                                             expected)
    if rank == 0:
        found["safe_loading"] = safe_loading(folder)
    found["dcp"] = dcp_save(args, rank, device, folder)
    dist.barrier()
    if temporary and rank == 0:
        shutil.rmtree(folder)
    return found


if __name__ == "__main__":
    main()
