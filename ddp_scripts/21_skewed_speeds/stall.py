"""Lesson 21, section 2: a rank that stops answering. The ranks train a DDP model until
the slow rank stalls at step --stall-at for ten timeouts; the others give up after
--stall-timeout seconds and the whole job fails, as it would in real life. Rank 0 writes
where and how long it waited before it fails.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/stall.py --stall-at 3
"""

import os
import time
import traceback

import torch
import torch.nn.functional as F
from ddp_common import arguments, record, setup, write_json
from skew_helpers import batch, elapsed_since, make_model, pick_slow_rank, wrap


@record  # the exception that ends main() goes into torchrun's report (lesson 01)
def main():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--stall-at", type=int, default=3, help="the step that stalls")
    parser.add_argument("--stall-timeout", type=float, default=2.0,
                        help="timeout of the process group, seconds")
    parser.add_argument("--slow-rank", type=int, help="default: the last rank")
    args = parser.parse_args()
    # Gloo on the CPU, also on a GPU node: its timeout is an exception we can record
    rank, _, world_size, _ = setup("cpu", "gloo", timeout_s=args.stall_timeout, ddp=True)
    slow = pick_slow_rank(args.slow_rank, world_size)
    device = torch.device("cpu")
    ddp = wrap(make_model(device), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(args.stall_at + 2):
        if rank == slow and step == args.stall_at:
            print(f"rank {rank}: stalling at step {step} for {10 * args.stall_timeout:g} s",
                  flush=True)
            time.sleep(10 * args.stall_timeout)
        x, y = batch(step, rank, device)
        optimizer.zero_grad()
        started = time.perf_counter()  # the step's own work takes milliseconds
        try:
            F.mse_loss(ddp(x), y).backward()
        except Exception as error:
            waited = elapsed_since(started)
            print(f"rank {rank}: step {step}: gave up waiting after {waited:.2f} s "
                  f"(timeout {args.stall_timeout:g} s)", flush=True)
            if rank == 0 and args.out:  # no report(): the others cannot answer now
                write_json(args.out, {
                    "world_size": world_size, "slow_rank": slow,
                    "nccl_async_error_handling": os.environ.get(
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                    "stall": {"step": step, "waited": waited, "timeout": args.stall_timeout,
                              "error": f"{type(error).__name__}: {error}"}})
            raise  # the job must fail: torchrun stops the others and reports it
        optimizer.step()
    raise SystemExit("the stalled rank never stalled: is --stall-at within the run?")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # recorded by @record; now leave as a crashed rank would
        traceback.print_exc()
        # Not `raise`: at exit, Python would destroy the process group with the timed-out
        # collective still pending, which can abort (SIGABRT, exit -6: seen in CI on torch
        # 2.13) in place of exit status 1. os._exit skips those destructors.
        os._exit(1)
