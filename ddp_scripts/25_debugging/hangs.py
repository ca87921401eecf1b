"""Lesson 25: three common hangs, each provoked on purpose and ended by a short
collective timeout, with what a practitioner collects to diagnose them.

    --bug rank0_metric    rank 0 alone reduces the loss to log it (`if rank == 0:`)
    --bug rank0_eval      rank 0 alone evaluates through the DDP wrapper, whose model
                          holds a buffer, while the other ranks train on
    --bug stalled_loader  one rank's dataset stalls in __getitem__

On the timeout each rank that caught it writes its flight recorder (its last
TORCH_FR_BUFFER_SIZE collectives, 2000 by default) to --dumps/fr/rank_<N>, and rank 0
writes every other local rank's Python stack (py-spy) to --dumps/stacks.txt.

    TORCH_FR_BUFFER_SIZE=2000 torchrun --standalone --nproc-per-node=2 \\
        ddp_scripts/25_debugging/hangs.py --bug rank0_metric --dumps /tmp/dumps
"""

import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown, write_json
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    """Random regression samples; the last rank's copy stalls at index `stall_at`."""

    def __init__(self, rank, world_size, stall_at=None, stall_s=0.0):
        self.stalls = rank == world_size - 1 and stall_at is not None
        self.stall_at, self.stall_s = stall_at, stall_s
        generator = torch.Generator().manual_seed(rank)
        self.x = torch.randn(64, 4, generator=generator)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if self.stalls and index == self.stall_at:  # bug 3
            time.sleep(self.stall_s)  # a file system that stopped answering, say
        return self.x[index], self.y[index]


def average_gradients(model):
    """All-reduce every gradient as one flat tensor (by hand, as in lesson 13: bugs 1 and 3
    average this way so that the gradient all-reduce is one readable line in a traceback)."""
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads)
    grads /= dist.get_world_size()
    for p, g in zip(model.parameters(), grads.split([p.numel() for p in model.parameters()])):
        p.grad.copy_(g.view_as(p))



def train_by_hand(world, args, stall_at=None):
    """Bugs 1 and 3: train, averaging gradients by hand; log the loss at step --log-at."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = Numbers(world.rank, world.world_size, stall_at, stall_s=4 * args.timeout)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        average_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        if step == args.log_at and world.rank == 0:  # bug 1: only rank 0 gets here
            total = loss.detach()  # shares loss's storage: the reduce writes the sum there
            dist.reduce(total, dst=0)  # rank 0 logs the mean loss
            print(f"step {step}: mean loss {total.item() / world.world_size:.3f}", flush=True)


class WithBuffer(torch.nn.Module):
    """A linear model holding a buffer (a fixed input scale), as many real models do."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.linear(x * self.scale)


def evaluate(model, x, y):
    model.eval()  # as evaluation code does (dropout off, batch norm's running statistics)
    with torch.no_grad():
        print(f"evaluating: training={model.training}, "
              f"grad enabled={torch.is_grad_enabled()}", flush=True)
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    model.train()
    return loss


def train_ddp(world, args):
    """Bug 2: after training, rank 0 evaluates through the DDP wrapper, alone."""
    torch.manual_seed(0)
    ddp = DDP(WithBuffer())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = Numbers(world.rank, world.world_size)
    try:
        for x, y in DataLoader(data, batch_size=8):
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if world.rank == 0:  # bug 2: the wrapper, on rank 0 only
            print(f"eval loss {evaluate(ddp, data.x, data.y):.3f}", flush=True)
        dist.barrier()  # every rank: wait for rank 0 before leaving
    finally:
        del ddp, optimizer  # no DDP model may outlive the group (lesson 13)



def dump_flight_recorder(folder, rank):
    """Write this rank's recent collectives, as the flight recorder keeps them (a pickle),
    and return them. _dump_fr_trace is private: it may change between releases."""
    trace = torch._C._distributed_c10d._dump_fr_trace()
    (folder / "fr").mkdir(parents=True, exist_ok=True)
    (folder / "fr" / f"rank_{rank}").write_bytes(trace)
    return pickle.loads(trace)["entries"]


def local_ranks():
    """{pid: rank} of the workers torchrun's agent started on this node."""
    agent = os.getppid()
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    found = {}
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = [v[5:] for v in environ if v.startswith(b"RANK=")]
        if rank:
            found[int(pid)] = int(rank[0])
    return found


def dump_stacks(folder):
    """Every other local rank's Python stack, with py-spy (it needs ptrace permission)."""
    py_spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if py_spy is None:
        return "py-spy is not installed"
    parts = []
    for pid, rank in sorted(local_ranks().items(), key=lambda item: item[1]):
        if pid != os.getpid():
            dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True,
                                  text=True, timeout=20)
            text = re.sub(r"\x1b\[[0-9;]*m", "", dump.stdout or dump.stderr)  # no colours
            parts.append(f"=== rank {rank} (pid {pid})\n{text}")
    (folder / "stacks.txt").write_text("".join(parts))
    return f"wrote the stacks of {len(parts)} other rank(s)"


def replay_with_detail(world):
    """Bug 1 again, in a fresh group created with TORCH_DISTRIBUTED_DEBUG=DETAIL's
    checks: before each collective, the ranks compare what they are about to call."""
    before = dist.get_debug_level()  # set from TORCH_DISTRIBUTED_DEBUG once, at import torch
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # too late: new_group reads the level
    print(f"TORCH_DISTRIBUTED_DEBUG=DETAIL set after the import: level "
          f"{dist.get_debug_level().name}, before {before.name}", flush=True)
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # the level, which new_group reads
    group = dist.new_group(backend="gloo")
    dist.set_debug_level(before)
    try:
        # bug 1 reduces a 0-dim tensor; with one, torch 2.13's DETAIL misnames rank 1's call
        if world.rank == 0:
            dist.reduce(torch.zeros(1), dst=0, group=group)  # so: one number, in a 1-D tensor
        else:
            dist.all_reduce(torch.zeros(5), group=group)  # the 5 gradients
    except RuntimeError as error:
        print(f"DETAIL caught it: {error}".splitlines()[0], flush=True)


@record
def main():
    parser = arguments(__doc__, device=False)
    parser.add_argument("--bug", choices=["rank0_metric", "rank0_eval", "stalled_loader"],
                        default="rank0_metric")
    parser.add_argument("--timeout", type=float, default=3, help="seconds a collective waits")
    parser.add_argument("--log-at", type=int, default=2, help="the step the bug strikes at")
    parser.add_argument("--dumps", help="a folder for the flight recorder and the stacks")
    parser.add_argument("--detail", action="store_true",
                        help="rank0_metric: replay the bug in a DETAIL group, after the dumps")
    parser.add_argument("--pdb-commands", help="a file of commands for a breakpoint on rank 0")
    args = parser.parse_args()
    # joining may be slow: a long timeout; ddp=True when the bug builds a DDP model (lesson 13)
    world = setup("cpu", timeout_s=60, ddp=args.bug == "rank0_eval")
    dist.barrier()  # every rank is here: from now on, a collective waits --timeout seconds
    # _set_pg_timeout is private (it may change): it shortens the timeout after start-up, which
    # keeps the long one; in your own job, init_process_group(timeout=...) is the public way
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=args.timeout))
    if args.pdb_commands:  # a debugging session, scripted: pdb reads them from stdin
        os.dup2(os.open(args.pdb_commands, os.O_RDONLY), 0)
        # rank 0 stops in pdb, the others wait in a barrier (one more entry in the trace);
        # None keeps the short timeout, fine for scripted commands (by hand: the default hour)
        dist.breakpoint(rank=0, timeout_s=None)
    try:
        if args.bug == "rank0_eval":
            train_ddp(world, args)
        else:
            stalls = args.bug == "stalled_loader"
            train_by_hand(world, args, stall_at=8 * args.log_at if stalls else None)
    except RuntimeError as error:  # the collective timed out
        caught_ns = time.time_ns()  # the flight recorder's clock too (on Linux)
        print(f"caught: {str(error).splitlines()[0][:160]}", flush=True)
        if args.dumps:
            folder = Path(args.dumps)
            entries = dump_flight_recorder(folder, world.rank)
            last = entries[-1]  # the collective that failed, stamped when it was issued
            waited = (caught_ns - last["time_created_ns"]) / 1e9
            print(f"flight recorder: {len(entries)} entries; the last, {last['profiling_name']}, "
                  f"failed {waited:.3f} s after it was issued", flush=True)
            if world.rank == 0:
                print(dump_stacks(folder), flush=True)
        if args.out and world.rank == 0:  # what rank 0 caught, for a test
            write_json(args.out, {"bug": args.bug, "caught": str(error).splitlines()[0]})
        if args.detail:
            replay_with_detail(world)
        raise
    teardown()


if __name__ == "__main__":
    main()
