"""Lesson 40 (capstone), part 6: rank 0 evaluates alone, through the DDP wrapper, while
the other ranks go on to their next collective. First with the lesson's GPT, then with
the same GPT holding a buffer: a causal mask registered on the model, as nanoGPT does
when it cannot use fused attention. --fix evaluates model.module instead.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/40_capstone_gpt/eval_trap.py
"""

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown
from gpt import make_model
from gpt_data import CONTEXT, batch, global_batch, load
from gpt_train import loss_sum
from torch.nn.parallel import DistributedDataParallel as DDP


def trained(model, train, world):
    """A DDP model after 3 steps on this rank's share of each batch."""
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for step in range(3):
        x, y = batch(global_batch(train, step, 24)[world.rank::world.world_size])
        total, count = loss_sum(ddp, x, y, bf16=False)
        (total / count).backward()
        optimizer.step()
        optimizer.zero_grad()
    return ddp


def rank_0_evaluates(ddp, validation, fix):
    """The trap: only rank 0 runs this."""
    model = ddp.module if fix else ddp  # the fix: the model inside the wrapper
    with torch.no_grad():
        total, count = loss_sum(model, *batch(validation), bf16=False)
    print(f"rank 0 evaluated alone: {total / count:.3f} nats per character", flush=True)


@record
def main():
    parser = arguments(__doc__, device=False)
    parser.add_argument("--timeout", type=float, default=10, help="seconds a collective waits")
    parser.add_argument("--fix", action="store_true", help="evaluate model.module")
    args = parser.parse_args()
    world = setup("cpu", timeout_s=args.timeout, ddp=True)
    chars, train, validation = load()
    for buffers in (False, True):
        model = make_model(len(chars))
        if buffers:  # a causal mask kept on the model: a buffer
            model.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT)))
        ddp = trained(model, train, world)
        if world.rank == 0:
            rank_0_evaluates(ddp, validation, args.fix)
        dist.barrier()  # every rank's next collective
        if world.rank == 0:
            print(f"buffers: {len(list(ddp.buffers()))}, the ranks went on together",
                  flush=True)
        del ddp
    teardown()


if __name__ == "__main__":
    main()
