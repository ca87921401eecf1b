"""Lesson 23: surviving a killed rank with torchrun --max-restarts and checkpoints.

The job trains for --steps steps and saves a checkpoint every --every steps (resuming.py).
With --kill-at STEP, rank --kill-rank kills itself with SIGKILL right after that step, the
first time the job runs. Started with torchrun --max-restarts=N, torchrun then stops the
other ranks and starts the whole group again; the new processes join under a store
prefix of their own (restart_store.py), find the newest checkpoint and go on from there.
At the end, the script trains the same run again, uninterrupted, and compares the weights.
--init plain joins without the prefix, and --slow-rejoin makes the trap that sets off
certain (lesson 24). Checkpoints and a log of events go to --dir, which must outlive
the processes (on several nodes, shared); by default a folder in the temp folder.

    torchrun --standalone --nproc-per-node=2 --max-restarts=3 \\
        ddp_scripts/23_fault_tolerance/fault_tolerance.py --kill-at 5
"""

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
import torch._dynamo  # noqa: F401  imported before the process group: lesson 13, "A clean exit"
import torch.distributed as dist
from ddp_common import arguments, pick_device, record, require_torchrun, teardown, write_json
from restart_store import addresses_in_store, init_for_restarts, meet
from resuming import Run, newest_checkpoint, train


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


def die(events, step):
    events.add("kill", step=step)
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception: as a crash


def resume_and_train(args, rank, device, folder, events, may_die):
    path, checkpoint = newest_checkpoint(folder, device, rank)
    start = 0 if checkpoint is None else checkpoint["step"]
    if may_die and args.kill_at == start:
        die(events, args.kill_at)
    run = Run(args.seed, rank, device, args.batch)
    if checkpoint is not None:
        run.load(checkpoint)
        events.add("resumed", step=run.step, checkpoint=path.name)

    def after_step(step):
        if step == start + 1:
            events.add("first step done", step=step)
        if rank == 0 and step % args.every == 0:
            events.add("saved", step=step)
        if may_die and step == args.kill_at:
            die(events, step)
    train(run, args.steps, args.every, folder, after_step)
    events.add("finished", step=run.step)
    return run.weights()


def uninterrupted(args, rank, device):
    run = Run(args.seed, rank, device, args.batch)  # the same run, never stopped
    train(run, args.steps, args.steps + 1, None)  # no checkpoint
    return run.weights()


def options():
    parser = arguments(__doc__)  # --device, --out (lesson 02)
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
    parser.add_argument("--timeout", type=float, default=30.0, help="group timeout, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", help="checkpoints and events (must outlive the processes)")
    return parser.parse_args()


@record
def main():
    args = options()
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill_rank = world_size - 1 if args.kill_rank is None else args.kill_rank
    if not 0 <= kill_rank < world_size:
        sys.exit(f"--kill-rank must be between 0 and {world_size - 1}")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    folder = Path(args.dir or Path(tempfile.gettempdir()) / f"ddp-course-08-{run_id}")
    folder.mkdir(parents=True, exist_ok=True)
    events = Events(folder, rank, restart)
    events.add("start", pid=os.getpid(), addresses_in_store=addresses_in_store(world_size))
    device = pick_device(args.device)
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
    may_die = rank == kill_rank and (restart == 0 or args.kill_every_attempt)
    resumed = resume_and_train(args, rank, device, folder, events, may_die)
    reference = uninterrupted(args, rank, device)
    dist.barrier()
    if rank == 0:
        if args.out:
            write_json(args.out, {
                "world_size": world_size, "backend": backend, "steps": args.steps,
                "every": args.every, "kill_at": args.kill_at, "kill_rank": kill_rank,
                "restart": restart, "max_restarts": int(os.environ.get(
                    "TORCHELASTIC_MAX_RESTARTS", "0")),
                "equal": torch.equal(resumed, reference),
                "max_abs_diff": (resumed - reference).abs().max().item(),
                "checkpoints": sorted(p.name for p in folder.glob("step-*.pt")),
                "events": events.read()})
        if args.dir is None:
            shutil.rmtree(folder)
    teardown()


if __name__ == "__main__":
    main()
