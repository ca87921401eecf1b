"""Lesson 08: surviving a killed rank with torchrun --max-restarts and checkpoints.

The job trains for --steps steps and saves a checkpoint every --every steps. With
--kill-at STEP, rank --kill-rank kills itself with SIGKILL right after that step, the
first time the job runs. Started with torchrun --max-restarts=N, torchrun then stops
the other ranks and starts the whole group again; the new processes find the newest
checkpoint and go on from there. At the end, the script trains the same run again
without any interruption and compares the weights.

Every restart reuses the store of torchrun's agent, and on torch 2.13 (from 2.6 on,
lesson 08 says why) a plain init_process_group can then read the addresses of the
dead processes from it. By default (--init fixed) the script gives every restart its
own key prefix in the store; --init plain shows the problem (made certain with
--slow-rejoin).

Checkpoints and a log of events go to --dir, which must outlive the processes (and on
several nodes be shared); by default a folder named after the job in the temp folder.

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 \\
        ddp_scripts/08_fault_tolerance.py --kill-at 5
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  imported before the process group: lesson 05, "A clean exit"
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import pick_device, record, require_torchrun, teardown
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--batch", type=int, default=8, help="batch per rank")
    parser.add_argument("--kill-at", type=int, default=None,
                        help="a rank kills itself right after this step (0: before training)")
    parser.add_argument("--kill-rank", type=int, default=None,
                        help="the rank that is killed (default: the last one)")
    parser.add_argument("--kill-every-attempt", action="store_true",
                        help="kill after every restart too, until torchrun gives up")
    parser.add_argument("--init", choices=["fixed", "plain"], default="fixed",
                        help="fixed: a store prefix per restart; plain: init_process_group")
    parser.add_argument("--slow-rejoin", type=float, default=0.0,
                        help="on a restart, all ranks meet, then rank 0 waits this long "
                             "before joining (so the others look up its address first)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="process group timeout, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", help="checkpoints and events (must outlive the processes)")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def launcher_store(world_size, timeout=timedelta(seconds=60)):
    """A client of the store torchrun's agent hosts, or None if the agent shares none
    (then rank 0 hosts a new store for each attempt)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         world_size, is_master=False, timeout=timeout)


def init_for_restarts(backend, rank, world_size, restart, timeout):
    """init_process_group, safe across torchrun restarts.

    torchrun's agent hosts the store and keeps it across restarts, with the keys the
    previous processes wrote: among them where to reach each rank. A restarted rank
    that reads one of those before its new value is written connects to a dead
    process. A prefix per restart gives each attempt keys of its own."""
    store = launcher_store(world_size, timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)  # a fresh store every time
        return
    dist.init_process_group(backend, store=dist.PrefixStore(f"restart-{restart}", store),
                            rank=rank, world_size=world_size, timeout=timeout)


def addresses_in_store(world_size):
    """The keys in the agent's store where ranks published their addresses: this
    attempt's, and whatever earlier attempts left there."""
    store = launcher_store(world_size)
    return [] if store is None else sorted(
        k for k in store.list_keys() if not k.startswith("ddp-course-meet"))


def meet(world_size, restart):
    """Wait (up to a minute) until every rank of this attempt has arrived, using the
    launcher's store and keys of our own."""
    store = launcher_store(world_size)
    if store is None:
        return
    key = f"ddp-course-meet-{restart}"
    store.add(key, 1)
    deadline = time.monotonic() + 60
    while store.add(key, 0) < world_size:
        if time.monotonic() > deadline:
            sys.exit("the other ranks did not arrive within 60 s")
        time.sleep(0.01)


class Events:
    """An append-only log shared by all ranks and all restarts (one JSON per line)."""

    def __init__(self, folder, rank, restart):
        self.path, self.rank, self.restart = Path(folder) / "events.jsonl", rank, restart

    def add(self, event, **details):
        line = json.dumps({"event": event, "rank": self.rank, "restart": self.restart,
                           "time": time.time(), **details})
        with open(self.path, "a") as f:  # one short write per line: lines do not mix
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self):
        return [json.loads(line) for line in self.path.read_text().splitlines()]


# Training, checkpoints -----------------------------------------------------------------

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
        """Everything this loop depends on (no scheduler, no NumPy or Python random
        numbers here); the random state is each rank's own, for dropout."""
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
    """Temporary file, flush, fsync, rename, fsync the folder (lesson 07)."""
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
                print(f"skipping damaged checkpoint {path}: {type(error).__name__}: {error}",
                      flush=True)
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return None, None
    path = Path(folder) / choice[0]
    if checkpoint is None:  # the other ranks load the one rank 0 chose
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    return path, checkpoint


def die(events, step):
    events.add("kill", step=step)
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception: as a crash


def train(args, rank, device, folder, events, restart, kill_rank):
    may_die = rank == kill_rank and (restart == 0 or args.kill_every_attempt)
    path, checkpoint = newest_checkpoint(folder, device, rank)
    if may_die and args.kill_at == (checkpoint or {}).get("step", 0):
        die(events, args.kill_at)
    run = Run(args.seed, rank, device, args.batch)
    if checkpoint is not None:
        run.load(checkpoint)
        events.add("resumed", step=run.step, checkpoint=path.name)
    batches = run.batches()
    while run.step < args.steps:
        run.train_step(*next(batches))
        if run.step == (checkpoint or {}).get("step", 0) + 1:
            events.add("first step done", step=run.step)
        if run.step % args.every == 0:
            state = run.state()
            if rank == 0:
                save_atomic(state, Path(folder) / f"step-{run.step:06d}.pt")
                events.add("saved", step=run.step)
            dist.barrier()  # the checkpoint is complete before anyone goes on
        if may_die and run.step == args.kill_at:
            die(events, run.step)
    events.add("finished", step=run.step)
    return run.weights()


def uninterrupted(args, rank, device):
    run = Run(args.seed, rank, device, args.batch)
    batches = run.batches()
    while run.step < args.steps:
        run.train_step(*next(batches))
    return run.weights()


@record
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill_rank = world_size - 1 if args.kill_rank is None else args.kill_rank
    if not 0 <= kill_rank < world_size:
        sys.exit(f"--kill-rank must be between 0 and {world_size - 1}")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    folder = Path(args.dir or Path(tempfile.gettempdir()) / f"ddp-course-08-{run_id}")
    folder.mkdir(parents=True, exist_ok=True)
    events = Events(folder, rank, restart)
    events.add("start", pid=os.getpid(), addresses_in_store=addresses_in_store(world_size))
    device = pick_device()
    backend = dist.get_default_backend_for_device(device)
    timeout = timedelta(seconds=args.timeout)
    if args.slow_rejoin:
        meet(world_size, restart)  # no rank is late by accident ...
        if restart > 0 and rank == 0:
            time.sleep(args.slow_rejoin)  # ... and rank 0 is late on purpose
    if args.init == "fixed":
        init_for_restarts(backend, rank, world_size, restart, timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    events.add("joined")

    resumed = train(args, rank, device, folder, events, restart, kill_rank)
    reference = uninterrupted(args, rank, device)
    dist.barrier()
    if rank == 0:
        found = {"world_size": world_size, "backend": backend, "steps": args.steps,
                 "every": args.every,
                 "kill_at": args.kill_at, "kill_rank": kill_rank,
                 "restart": restart, "max_restarts": int(os.environ.get(
                     "TORCHELASTIC_MAX_RESTARTS", "0")),
                 "equal": torch.equal(resumed, reference),
                 "max_abs_diff": (resumed - reference).abs().max().item(),
                 "checkpoints": sorted(p.name for p in folder.glob("step-*.pt")),
                 "events": events.read()}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(found, f)
        if args.dir is None:
            shutil.rmtree(folder)
    teardown()


if __name__ == "__main__":
    main()
