"""Lesson 21, section 4: what Join costs, and what it does not shadow.

1. the all-reduces one forward pass starts, without Join, with it, with buffers, with
   throw_on_early_termination, and in a forward pass after the Join block;
2. rank 0 has more batches (--batches RANK0 OTHERS) and every rank all-reduces its loss
   after each step, inside Join: it hangs (on Gloo groups with a short timeout, caught
   and recorded); then the fix, throw_on_early_termination=True.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/join_limits.py
"""

import contextlib
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from skew_helpers import batch, elapsed_since, fingerprint, make_model, momentum_of, wrap
from torch.distributed.algorithms.join import Join


class CountedAllReduces:
    """Counts the calls to dist.all_reduce while it is active. DDP's and Join's Python
    code calls it through torch.distributed (DDP's gradient all-reduces start in C++
    and are not counted: the forward pass has none)."""

    def __enter__(self):
        self.calls, self.real = 0, dist.all_reduce

        def counted(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.real


def all_reduces_per_forward(rank, device):
    """All-reduces started by each of three forward passes, every rank with the same
    number of batches, and by one forward pass after the loop (outside any Join)."""
    counts = {}
    for label, buffers, join in [("plain", False, None), ("join", False, {}),
                                 ("join_buffers", True, {}),
                                 ("join_throw", False, {"throw_on_early_termination": True})]:
        ddp = wrap(make_model(device, buffers), device)
        per_forward = []
        with Join([ddp], **join) if join is not None else contextlib.nullcontext():
            for step in range(3):
                x, y = batch(step, rank, device)
                with CountedAllReduces() as counter:
                    output = ddp(x)
                per_forward.append(counter.calls)
                F.mse_loss(output, y).backward()
        with CountedAllReduces() as counter:  # one more forward pass, after the block
            output = ddp(x)
        F.mse_loss(output, y).backward()
        counts[label] = {"per_forward": per_forward, "after_the_block": counter.calls}
    return counts



def join_with_a_metric(rank, n_batches, device, short_timeout, throw):
    """The uneven loop inside Join, plus an all-reduce of our own in every step (the
    loss summed over the ranks, for a log line). Join knows nothing of it."""
    if throw:  # the fix, where a real script has it: the metric on DDP's (default) group
        ddp_group = metric_group = None
    else:  # short timeouts, and the metric on a group of its own, to catch the failure
        short = timedelta(seconds=short_timeout)
        ddp_group = dist.new_group(backend="gloo", timeout=short)
        metric_group = dist.new_group(backend="gloo", timeout=short)
        device = torch.device("cpu")
    model = make_model(device)
    ddp = wrap(model, device, ddp_group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    steps, error = 0, None
    where, since = "start", time.perf_counter()  # where each rank is, and since when
    try:
        with Join([ddp], throw_on_early_termination=throw):
            for step in range(n_batches):
                where, since = "training", time.perf_counter()
                x, y = batch(step, rank, device)
                optimizer.zero_grad()
                loss = F.mse_loss(ddp(x), y)
                loss.backward()
                optimizer.step()
                where, since = "metric", time.perf_counter()
                dist.all_reduce(loss.detach(), group=metric_group)
                steps += 1
            where, since = "joined", time.perf_counter()  # Join's exit runs next
    except RuntimeError as failure:  # the error is the result of the experiment
        error = f"{type(failure).__name__}: {failure}"
    found = {"batches": n_batches, "steps": steps, "where": where, "error": error,
             "seconds": elapsed_since(since)}
    if throw:
        found["weights"] = fingerprint(model.parameters())
        found["momentum"] = fingerprint(momentum_of(optimizer))
    return found


@record  # an exception that ends main() goes into torchrun's report (lesson 01)
def main():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--batches", type=int, nargs=2, default=[6, 4],
                        metavar=("RANK0", "OTHERS"), help="batches of rank 0 and of the others")
    parser.add_argument("--short-timeout", type=float, default=1.0,
                        help="timeout of the groups that hang, seconds")
    args = parser.parse_args()
    rank, _, _, device = setup(args.device, timeout_s=30, ddp=True)  # lessons 02, 13
    n_batches = args.batches[0] if rank == 0 else args.batches[1]
    mine = {"join_costs": all_reduces_per_forward(rank, device)}
    mine["join_metric"] = join_with_a_metric(rank, n_batches, device, args.short_timeout,
                                             throw=False)
    dist.barrier()  # every rank starts the fix together
    mine["join_metric_throw"] = join_with_a_metric(rank, n_batches, device,
                                                   args.short_timeout, throw=True)
    report(args.out, mine, batches=args.batches, short_timeout=args.short_timeout)
    teardown()


if __name__ == "__main__":
    main()
