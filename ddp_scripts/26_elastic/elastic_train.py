"""Lesson 26: DDP training that a host may leave and rejoin (torchrun's elastic mode).

The digits MLP (lesson 03) with a global batch that stays the same at any world size:
micro-batches of --micro samples, as many per rank as the world needs (`plan_batches`);
the samples of global step s are drawn from s's own seed, so a step is the same step
whichever world runs it. Every --save-every steps, a sharded DCP checkpoint, which a
world of any size loads; a restarted world resumes from the newest. Rank 0 appends a
line per step to DIR/steps.jsonl (JSON: step, world size, loss, time). With --leave-at
STEP, the ranks on --host kill their torchrun agent and exit at that step, as if the
host had died.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=2 \\
        --rdzv-backend=c10d --rdzv-endpoint=nodeA:29400 --rdzv-id=job1 --max-restarts=3 \\
        ddp_scripts/26_elastic/elastic_train.py --dir /tmp/job1     # on each host
"""

import json
import os
import shutil
import signal
import socket
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from digits_data import load_data, make_model
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def plan_batches(global_batch, micro, world_size):
    """How many micro-batches of `micro` samples each rank accumulates per step so that
    the ranks together take `global_batch` samples; an error if they cannot."""
    if global_batch % (micro * world_size):
        raise ValueError(f"{world_size} ranks cannot take a global batch of {global_batch} "
                         f"in micro-batches of {micro}")
    return global_batch // (micro * world_size)


def step_samples(step, size, global_batch, seed):
    """The samples of global step `step`: a draw of its own seed, whatever the world."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(size, generator=generator)[:global_batch]


def train_step(model, optimizer, x, y, samples, micro, world):
    """One optimizer step on the global batch `samples`: this rank's micro-batches, the
    gradients averaged over the world at the last one. Returns the batch's mean loss."""
    accumulate = plan_batches(len(samples), micro, world.world_size)
    total = torch.zeros((), dtype=torch.float64)
    for k in range(accumulate):
        first = (k * world.world_size + world.rank) * micro
        mine = samples[first:first + micro]
        last = k == accumulate - 1  # only its backward all-reduces (forward and
        with nullcontext() if last else model.no_sync():  # backward under no_sync)
            loss = F.cross_entropy(model(x[mine]), y[mine], reduction="sum")
            (loss * world.world_size / len(samples)).backward()  # DDP averages
        total += loss.detach()
    optimizer.step()
    optimizer.zero_grad()
    dist.all_reduce(total)
    return total.item() / len(samples)


def newest(folder):
    """The step of the newest complete checkpoint in `folder` (0: none)."""
    pointer = folder / "latest"
    return int(pointer.read_text()) if pointer.exists() else 0


def save(folder, step, model, optimizer):
    """Every rank's part of `step` into folder/step-N, then `latest` names it."""
    target = folder / f"step-{step}"
    if dist.get_rank() == 0:  # a step done again after a restart: its old folder goes, so
        shutil.rmtree(target, ignore_errors=True)  # a save cut short leaves no .metadata
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=target)
    if dist.get_rank() == 0:  # dcp.save returns once .metadata is written: all parts are in
        partial = folder / "latest.partial"
        partial.write_text(str(step))
        os.replace(partial, folder / "latest")


def load(folder, step, model, optimizer):
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=folder / f"step-{step}")
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def leave():
    """This host's end: kill the torchrun agent above this process (`torchrun ...` or
    `python -m torch.distributed.run ...`; killed ranks alone, it would restart), then exit."""
    pid = os.getppid()
    while pid > 1:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"torch.distributed.run" in command or b"bin/torchrun" in command:
            os.kill(pid, signal.SIGKILL)
            break
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os._exit(1)


@record
def main():
    parser = arguments(__doc__, device=False)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/elastic-job"),
                        help="checkpoints and the log, in a folder every host sees")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16, help="samples per micro-batch")
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5, help="seconds a collective waits")
    parser.add_argument("--host", default="nodeB", help="the host that --leave-at ends")
    parser.add_argument("--leave-at", type=int, help="the step at which --host's processes die")
    args = parser.parse_args()
    world = setup("cpu", timeout_s=args.timeout, ddp=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    x, y = load_data(0)[0].tensors
    model = DDP(make_model(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = newest(args.dir)
    if start:
        load(args.dir, start, model, optimizer)
    plan_batches(args.global_batch, args.micro, world.world_size)  # fails here, if at all
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    log = (args.dir / "steps.jsonl").open("a") if world.rank == 0 else None

    def write(**entry):
        if log:
            log.write(json.dumps({**entry, "world": world.world_size, "restart": restart,
                                  "time": time.time()}) + "\n")
            log.flush()

    restarts = [None] * world.world_size  # each rank's, as its own agent counts them
    dist.all_gather_object(restarts, restart)
    write(event="start", step=start, restarts=restarts)
    for step in range(start, args.steps):
        if step == args.leave_at and start == 0 and socket.gethostname() == args.host:
            leave()
        samples = step_samples(step, len(x), args.global_batch, seed=0)
        loss = train_step(model, optimizer, x, y, samples, args.micro, world)
        write(step=step + 1, loss=loss)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save(args.dir, step + 1, model, optimizer)
    report(args.out, {"rank": world.rank, "host": socket.gethostname()}, resumed_from=start,
           weights=torch.cat([p.detach().flatten() for p in model.module.parameters()]).tolist())
    del model
    teardown()


if __name__ == "__main__":
    main()
