"""A DDP training script to copy: plain PyTorch, nothing from the course.

One machine with N GPUs (or N processes on the CPU):
    torchrun --standalone --nproc-per-node=N train.py --out run
Several machines: the same command on each, all pointing at one of them, with --out on
a filesystem that every machine sees (rank 0 writes the checkpoint, every rank reads it):
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-id=job1 --rdzv-backend=c10d \\
        --rdzv-endpoint=node0.example.com:29400 train.py --out /shared/run
Started again with the same --out, it resumes from the last checkpoint, the same run (bit
for bit on GPUs only with --exact; if your dataset draws random numbers in DataLoader
workers, seed them from the epoch and the sample's index, or a resumed epoch's workers
draw others). To let torchrun restart it after a crash, add --max-restarts=3 and set
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment (lesson 24: otherwise a
restarted rank can read a dead rank's address).

--batch is the global batch: samples per optimizer step, whatever the world size. Each
rank takes batch / (world size x accumulate) samples per forward. The learning rate goes
with the global batch: if you change --batch, scale --lr by the same factor (and divide
--warmup by it: the warm-up stays as long in samples), then check the loss curve.
"""

import argparse
import contextlib
import datetime
import itertools
import math
import os
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.tensorboard import SummaryWriter

# What defines the run: a resume with other values would be another run.
RUN = ("epochs", "batch", "accumulate", "lr", "warmup", "clip", "precision", "batch_norm",
       "sync_bn", "dropout", "seed")


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="run", help="checkpoints and TensorBoard logs go here")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=48, help="global batch (samples per step)")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    p.add_argument("--lr", type=float, default=0.05, help="for --batch; scale it with --batch")
    p.add_argument("--warmup", type=int, default=5, help="steps of linear warm-up")
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--batch-norm", action="store_true", help="a BatchNorm layer in the model")
    p.add_argument("--sync-bn", action="store_true", help="BatchNorm over the global batch")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--save-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, default=10, help="steps between loss all-reduces")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exact", action="store_true",
                   help="deterministic kernels and no TF32, to compare runs number for number")
    p.add_argument("--crash-at-step", type=int, default=-1,  # delete it from your copy
                   help="a drill for the lesson: rank 1 dies at this step, first attempt")
    return p.parse_args()


def setup(exact=False):
    """Join the job torchrun started; one device per process."""
    local_rank = int(os.environ["LOCAL_RANK"])
    timeout = datetime.timedelta(minutes=10)  # how long a collective waits for a rank
    # DDP's constructor imports torch._dynamo; imported after the group exists, it keeps the
    # group alive past destroy_process_group, and a rank can abort at exit (torch 2.13,
    # lesson 13). Imported first, it does not.
    import torch._dynamo  # noqa: F401
    if exact:  # for checking runs, not for training: slower on GPUs, and an op with no
        # deterministic kernel raises. The same numbers run after run; across world sizes,
        # the same to rounding. (Reading cudnn.allow_tf32 then raises: not with torch.compile.)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # cuDNN's default for convs: TF32
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"local rank {local_rank}, but {torch.cuda.device_count()} "
                             "GPU(s): start at most one process per GPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before anything touches the GPU
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return device


def datasets():
    """Your data here. The digits ship with scikit-learn: 1,440 to train, 357 to validate."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    y = torch.tensor(y)
    return TensorDataset(x[:1440], y[:1440]), TensorDataset(x[1440:], y[1440:])


def make_model(args):
    norm = nn.BatchNorm2d(16) if args.batch_norm else nn.Identity()
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), norm, nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dropout(args.dropout), nn.Linear(32 * 16, 10))
    if args.sync_bn:  # BatchNorm statistics over all ranks' samples (not on the CPU)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can start part-way through an epoch (after a resume)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0  # samples of this rank's share already used in this epoch

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self):
        return self.num_samples - self.start


def rng_states(device):
    """This rank's random states: torch's, Python's and, on a GPU, CUDA's. Add NumPy's if
    your code draws from it."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_states(state, device):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save(path, model, optimizer, scheduler, scaler, step, log, run, device):
    """Every rank's random states go to rank 0, which writes the file atomically."""
    states = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rng_states(device), states, dst=0)
    if dist.get_rank() == 0:
        checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                      "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                      "step": step, "rng": states, "log": log, "run": run}
        partial = path.with_suffix(".partial")
        with open(partial, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())  # the data on the disk before the rename
        os.replace(partial, path)  # readers see the old file or the new one, never half
        folder = os.open(path.parent, os.O_RDONLY)
        os.fsync(folder)  # and the rename too: after a power cut, the new file is there
        os.close(folder)
    # Nobody goes on (or reads it) before it is written. The others wait here while rank 0
    # writes: the group's timeout (setup) must be longer than a save.
    dist.barrier()


def load(path, model, optimizer, scheduler, scaler, run, device):
    # Onto the CPU: saved from rank 0's cuda:0, each rank would load it onto its node's cuda:0.
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if checkpoint["run"] != run:
        raise SystemExit(f"{path} is of another run: {checkpoint['run']}; this one: {run}. "
                         "Use another --out, or the same options.")
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    scaler.load_state_dict(checkpoint["scaler"])
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(checkpoint["rng"]) == world:
        set_rng_states(checkpoint["rng"][rank], device)
    elif rank == 0:  # the data position holds (it depends on the global batch only)
        print(f"resuming {len(checkpoint['rng'])} ranks' run on {world}: new random states, "
              "so the run goes on, but not bit for bit as it would have", flush=True)
    return checkpoint["step"], checkpoint["log"]


@torch.no_grad()
def validate(model, dataset, device, batch):
    """Exact: each sample once (no padding), sums and counts added over the ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = DataLoader(dataset, batch_size=batch, sampler=range(rank, len(dataset), world))
    module = model.module  # no collectives: ranks may run different numbers of batches
    for buffer in module.buffers():  # BatchNorm's running statistics: rank 0's everywhere
        dist.broadcast(buffer, src=0)
    modes = {m: m.training for m in module.modules()}  # a layer kept in eval mode stays so
    module.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, samples
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = module(x)
        sums += torch.stack([F.cross_entropy(logits, y, reduction="sum").double(),
                             (logits.argmax(1) == y).sum().double(),
                             torch.tensor(len(y), dtype=torch.float64, device=device)])
    for m, training in modes.items():
        m.training = training
    dist.all_reduce(sums)
    loss, correct, samples = sums.tolist()
    return {"loss": loss / samples, "accuracy": correct / samples, "samples": int(samples)}


@record  # torchrun's failure report then holds the exception (lesson 01)
def main():
    args = arguments()
    if "LOCAL_RANK" not in os.environ:  # started by plain python: say how, lose nothing
        raise SystemExit(f"{sys.argv[0]}: start it with torchrun, for example\n"
                         f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")
    device = setup(args.exact)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = args.batch // (world * args.accumulate)  # samples per rank per forward
    if micro * world * args.accumulate != args.batch:
        raise SystemExit(f"--batch {args.batch} is not a multiple of world size {world} "
                         f"x --accumulate {args.accumulate}")
    run = {name: getattr(args, name) for name in RUN}
    train_set, val_set = datasets()
    sampler = ResumableSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                               seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=micro, sampler=sampler, drop_last=True,
                        num_workers=args.workers, pin_memory=device.type == "cuda",
                        generator=torch.Generator())  # seeded each epoch, below
    steps_per_epoch = len(train_set) // args.batch
    total_steps = args.epochs * steps_per_epoch

    torch.manual_seed(args.seed)  # one initial model (DDP also copies rank 0's to all)
    model = make_model(args).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        (s + 1) / max(1, args.warmup), 0.5 * (1 + math.cos(math.pi * s / total_steps))))
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    half = torch.bfloat16 if args.precision == "bf16" else torch.float16
    torch.manual_seed(args.seed + 1 + rank)  # dropout: each rank its own masks
    random.seed(args.seed + 1 + rank)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "checkpoint.pt"
    seen = [None] * world
    dist.all_gather_object(seen, path.exists())  # every rank must see the same files
    if len(set(seen)) > 1:  # every rank stops, not only those that differ
        raise SystemExit(f"{path} exists for ranks {[r for r in range(world) if seen[r]]} "
                         "only: put --out on a filesystem that every machine shares")
    step, log = 0, {"loss": [], "val": []}
    if seen[0]:
        step, log = load(path, model, optimizer, scheduler, scaler, run, device)
    writer = SummaryWriter(out / "tensorboard", purge_step=step + 1) if rank == 0 else None
    if rank == 0:
        print(f"world size {world}: global batch {args.batch} = {world} rank(s) x "
              f"{args.accumulate} micro-batches x {micro} samples; step {step} of "
              f"{total_steps}", flush=True)

    pending = []  # the steps' losses, kept on the device until they are all-reduced

    def all_reduce_losses():  # every rank calls it at the same steps: it is a collective
        if pending:
            losses = torch.stack(pending)
            dist.all_reduce(losses)  # the loss of each step over the global batch
            for loss in (losses / world).tolist():
                log["loss"].append(loss)
                if writer:
                    writer.add_scalar("train/loss", loss, len(log["loss"]))
            pending.clear()

    while step < total_steps:
        epoch = step // steps_per_epoch
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        # The loader draws its workers' seeds (and, without workers, one number) from its
        # generator: from (seed, rank, epoch), the same after a resume.
        # (1_000_003: more than any number of epochs, so no two (rank, epoch) share a seed)
        loader.generator.manual_seed(args.seed + 1_000_003 * (rank + 1) + epoch)
        sampler.start = (step % steps_per_epoch) * args.accumulate * micro
        batches = iter(loader)
        for _ in range(steps_per_epoch - step % steps_per_epoch):
            if step == args.crash_at_step and rank == 1 and \
                    os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
                os._exit(1)  # the drill: this rank dies without a word
            loss_sum = torch.zeros((), device=device)
            for i in range(args.accumulate):
                x, y = (t.to(device, non_blocking=True) for t in next(batches))
                last = i == args.accumulate - 1  # only its backward all-reduces
                with contextlib.nullcontext() if last else model.no_sync():
                    with torch.autocast(device.type, half, enabled=args.precision != "fp32"):
                        loss = F.cross_entropy(model(x), y) / args.accumulate
                    scaler.scale(loss).backward()
                loss_sum += loss.detach().float()
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(optimizer)  # skipped if fp16 overflowed
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if writer:
                writer.add_scalar("train/lr", scheduler.get_last_lr()[0], step + 1)
            scheduler.step()
            step += 1
            pending.append(loss_sum)
            if step % args.log_every == 0:
                all_reduce_losses()
            if step % args.save_every == 0 and step % steps_per_epoch:
                all_reduce_losses()
                save(path, model, optimizer, scheduler, scaler, step, log, run, device)
        all_reduce_losses()
        log["val"].append(validate(model, val_set, device, batch=64))
        save(path, model, optimizer, scheduler, scaler, step, log, run, device)
        if writer:
            writer.add_scalar("val/loss", log["val"][-1]["loss"], step)
            writer.add_scalar("val/accuracy", log["val"][-1]["accuracy"], step)
            print(f"epoch {epoch}: train loss {log['loss'][-1]:.4f} (last step), validation "
                  f"loss {log['val'][-1]['loss']:.4f}, accuracy "
                  f"{log['val'][-1]['accuracy']:.4f} ({log['val'][-1]['samples']} samples)",
                  flush=True)
    if writer:
        writer.close()
    del model  # free DDP before its process group: the other order can hang (Gloo; lesson 13)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
