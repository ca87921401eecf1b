"""Lesson 21, section 4: uneven inputs. Rank 0 has more batches than the others
(--batches RANK0 OTHERS):

1. without Join, on a Gloo group with a short timeout: rank 0's next all-reduce has no
   partner and times out (caught and recorded);
2. with Join (SGD with momentum), with and without divide_by_initial_world_size: the
   gradients of rank 0's extra steps, and the weights and momentum of every rank.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/21_skewed_speeds/uneven.py
"""

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from skew_helpers import attempt, batch, fingerprint, make_model, momentum_of, wrap
from torch.distributed.algorithms.join import Join


def uneven_without_join(rank, n_batches, short_timeout):
    """The others finish their loop and wait at the next barrier (on the main group);
    rank 0's next all-reduce has no partner."""
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=short_timeout))
    cpu = torch.device("cpu")
    ddp = wrap(make_model(cpu), cpu, group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    steps_done, outcome = 0, None
    for step in range(n_batches):
        x, y = batch(step, rank, cpu)
        optimizer.zero_grad()
        outcome = attempt(lambda x=x, y=y: F.mse_loss(ddp(x), y).backward())
        if outcome["error"]:
            break
        optimizer.step()
        steps_done += 1
    return {"batches": n_batches, "steps_done": steps_done, **outcome}



def same(tensors, others):
    """Equal up to float64 rounding (DDP may divide by N where we multiply by 1/N)."""
    return all(torch.allclose(t, o, rtol=1e-12, atol=1e-15) for t, o in zip(tensors, others))


def uneven_with_join(rank, n_batches, even, device, divide_by_initial_world_size):
    """The same uneven loop inside Join, with momentum. On rank 0's extra steps (from
    step `even` on), compare the gradient DDP leaves with the gradient of rank 0's batch
    alone. Then take one more step on every rank, as the next epoch would."""
    model = make_model(device)
    ddp = wrap(model, device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    extra_steps, optimizer_steps = [], 0
    with Join([ddp], divide_by_initial_world_size=divide_by_initial_world_size):
        for step in range(n_batches):
            x, y = batch(step, rank, device)
            optimizer.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            if step >= even:  # the others have joined: only this rank is left
                alone = make_model(device)
                alone.load_state_dict(model.state_dict())
                F.mse_loss(alone(x), y).backward()
                own = [p.grad for p in alone.parameters()]
                got = [p.grad for p in model.parameters()]
                over_n = [o / dist.get_world_size() for o in own]
                extra_steps.append({"step": step, "equals_own_gradient": same(got, own),
                                    "equals_own_gradient_over_world_size": same(got, over_n)})
            optimizer.step()
            optimizer_steps += 1
        weights_own = fingerprint(model.parameters())  # before Join's exit runs
    found = {"batches": n_batches, "extra_steps": extra_steps,
             "optimizer_steps": optimizer_steps, "weights_own": weights_own,
             "weights_after": fingerprint(model.parameters()),
             "momentum_after": fingerprint(momentum_of(optimizer))}
    x, y = batch(100, rank, device)  # one more step, every rank: the next epoch begins
    optimizer.zero_grad()
    F.mse_loss(ddp(x), y).backward()
    optimizer.step()
    found["weights_next_step"] = fingerprint(model.parameters())
    return found


@record  # an exception that ends main() goes into torchrun's report (lesson 01)
def main():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--batches", type=int, nargs=2, default=[6, 4],
                        metavar=("RANK0", "OTHERS"), help="batches of rank 0 and of the others")
    parser.add_argument("--short-timeout", type=float, default=1.0,
                        help="timeout of the group without Join, seconds")
    args = parser.parse_args()
    rank, _, _, device = setup(args.device, timeout_s=30, ddp=True)  # lessons 02, 13
    n_batches, even = (args.batches[0] if rank == 0 else args.batches[1]), args.batches[1]
    mine = {"uneven": uneven_without_join(rank, n_batches, args.short_timeout)}
    dist.barrier()  # the others wait here while rank 0 waits for its partner
    mine["join"] = uneven_with_join(rank, n_batches, even, device, True)
    mine["join_no_divide"] = uneven_with_join(rank, n_batches, even, device, False)
    report(args.out, mine, batches=args.batches, short_timeout=args.short_timeout)
    teardown()


if __name__ == "__main__":
    main()
