"""Lesson 13, section 1: at construction DDP copies rank 0's parameters and buffers to
every rank (each rank starts here from different random weights on purpose), and it
copies rank 0's buffers again at the start of every training forward.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/13_inside_ddp/broadcast.py
"""

import torch
from ddp_common import arguments, record, report, setup, teardown
from small_model import FEATURES, make_model, wrap


def check_broadcast(rank, device):
    """Each rank builds its model from its own seed and sets its BatchNorm's running
    mean to its rank; DDP makes them all rank 0's. Then two training steps, each rank
    on its own batch: a forward pre-hook notes the running mean BatchNorm starts from."""
    model = make_model(seed=rank, batchnorm=True).to(device)
    norm = model[1]
    norm.running_mean.fill_(rank)
    found = {"before": sum(p.sum().item() for p in model.parameters()),
             "buffer_before": norm.running_mean.sum().item()}
    ddp = wrap(model, device)
    found.update(after=sum(p.sum().item() for p in ddp.module.parameters()),
                 buffer_after=norm.running_mean.sum().item(), buffer_at_forward=[])
    norm.register_forward_pre_hook(
        lambda module, args: found["buffer_at_forward"].append(module.running_mean.sum().item()))
    x = torch.randn(8, FEATURES, generator=torch.Generator().manual_seed(rank)).to(device)
    for _ in range(2):
        ddp(x).sum().backward()
    found["buffer_at_end"] = norm.running_mean.sum().item()  # after this rank's own update
    return found  # the DDP model goes with this function: before teardown()


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: see "A clean exit" in the lesson
    report(args.out, check_broadcast(world.rank, world.device), device=str(world.device))
    teardown()


if __name__ == "__main__":
    main()
