"""Soak the warm launcher: many launches in a row, half of them while other processes keep
every core busy, each checked for how it ended. Forking a process that has threads is the
known risk of warm launches; a launch that fails one time in a hundred shows up here.

    python -m tools.soak [--launches 500] [--busy-share 0.5] [--timeout 60]

Each launch is one of the kinds below, in turn: a DDP model on 2 ranks; a rank that fails
(torchrun exits 1); a rank killed by SIGKILL that torchrun restarts (--max-restarts=1,
then success); 4 ranks all-reducing; a plain `python` run. A launch that ends otherwise,
or runs past its timeout, is a failure. Prints the counts, the seconds per kind (idle and
busy), and every failure; exits 1 if there was one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path

from tools.launch import LaunchError, launch

SCRIPTS = {
    "ddp": """\
import torch
import torch._dynamo  # noqa: F401  before the group, as the course's DDP scripts do
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(8, 2))
model(torch.randn(4, 8)).sum().backward()
print("rank", dist.get_rank(), "grad", round(model.module.weight.grad.sum().item(), 4))
del model
dist.destroy_process_group()
""",
    "fails": """\
import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(3)
dist.barrier()
""",
    "restarted": """\
import os
import signal

import torch
import torch.distributed as dist

store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False)
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo", store=dist.PrefixStore(f"restart-{restart}", store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
if restart == "0" and dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
total = torch.ones(1)
dist.all_reduce(total)
print("attempt", restart, "sum", int(total.item()), flush=True)
dist.destroy_process_group()
""",
    "four": """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
assert int(total.item()) == 4, total
dist.destroy_process_group()
""",
    "plain": """\
import torch

print("sum", int(torch.ones(3).sum().item()))
""",
}
KINDS = {  # kind: (launch options, expected exit status, a line the output must hold)
    "ddp": ({"nproc": 2}, 0, "[default1]:rank 1 grad"),
    "fails": ({"nproc": 2, "expect_failure": True}, 1, "rank 1 gives up"),
    "restarted": ({"nproc": 2, "max_restarts": 1}, 0, "[default1]:attempt 1 sum 2"),
    "four": ({"nproc": 4}, 0, ""),
    "plain": ({"nproc": None}, 0, "sum 3"),
}


def _busy() -> None:
    while True:
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=500)
    parser.add_argument("--busy-share", type=float, default=0.5,
                        help="the share of launches made while every core is kept busy")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="ddp-course-soak-"))
    for kind, text in SCRIPTS.items():
        (folder / f"{kind}.py").write_text(text)
    kinds = list(KINDS)
    busy_from = round(args.launches * (1 - args.busy_share))
    burners: list[multiprocessing.Process] = []
    seconds: dict[tuple[str, bool], list[float]] = {}
    failures, cold = [], 0
    try:
        for i in range(args.launches):
            busy = i >= busy_from
            if busy and not burners:
                burners = [multiprocessing.Process(target=_busy, daemon=True)
                           for _ in range(os.cpu_count() or 1)]
                for burner in burners:
                    burner.start()
            kind = kinds[i % len(kinds)]
            options, status, line = KINDS[kind]
            try:
                result = launch(f"{kind}.py", cwd=folder, timeout=args.timeout, echo=False,
                                **options)
                problem = None
                if result.returncode != status:
                    problem = f"exit status {result.returncode}, expected {status}"
                elif line not in result.output:
                    problem = f"no line {line!r}"
            except LaunchError as error:
                result, problem = error.result, str(error).splitlines()[0]
            cold += not result.warm
            seconds.setdefault((kind, busy), []).append(result.seconds)
            if problem:
                failures.append(f"launch {i + 1} ({kind}, {'busy' if busy else 'idle'}): "
                                f"{problem}\n{result.tail(15)}")
                print(failures[-1], flush=True)
            if (i + 1) % 50 == 0:
                print(f"{i + 1} launches, {len(failures)} failure(s)", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
    print(f"\n{args.launches} launches ({args.launches - busy_from} with every core busy): "
          f"{len(failures)} failure(s), {cold} cold")
    for (kind, busy), times in sorted(seconds.items()):
        print(f"  {kind:<10} {'busy' if busy else 'idle'}: median {statistics.median(times):.2f} s,"
              f" max {max(times):.2f} s over {len(times)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
