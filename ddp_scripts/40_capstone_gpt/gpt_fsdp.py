"""Lesson 40 (capstone): the small GPT trained with FSDP2 (fully_shard): gpt_ddp.py with
the lines marked FSDP2 changed.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/40_capstone_gpt/gpt_fsdp.py
"""

import os  # NEW
import signal  # NEW
import sys  # NEW
from pathlib import Path  # NEW

import torch
import torch.distributed as dist  # NEW
from ddp_common import setup, teardown, write_results  # NEW
from digits_cnn import Meter
from gpt import make_model
from gpt_data import IGNORE, batch, global_batch, load
from gpt_train import generate, learning_rate, loss_sum, options
from resuming import newest_checkpoint, save_atomic  # NEW: lesson 23's
from torch.distributed.checkpoint.state_dict import (  # FSDP2: whole state dicts
    StateDictOptions,  # FSDP2
    get_model_state_dict,  # FSDP2
    get_optimizer_state_dict,  # FSDP2
    set_model_state_dict,  # FSDP2
    set_optimizer_state_dict,  # FSDP2
)  # FSDP2
from torch.distributed.device_mesh import init_device_mesh  # FSDP2
from torch.distributed.fsdp import fully_shard  # FSDP2

PROMPT = "The "
FULL = StateDictOptions(full_state_dict=True)  # FSDP2: whole tensors, on every rank


@torch.no_grad()
def evaluate(model, windows, bf16):
    """Nats per character: the summed loss of the windows over their counted tokens."""
    model.eval()
    total, count = loss_sum(model, *batch(windows), bf16)
    sums = torch.stack([total, count.float()])  # NEW
    dist.all_reduce(sums)  # NEW: the sums and counts of all ranks' windows
    total, count = sums  # NEW
    model.train()
    return (total / count).item()


def resume(args, world, model, optimizer):  # NEW: part 7, from the newest checkpoint
    if not args.checkpoints:  # NEW
        return 0, []  # NEW: step 0, no losses yet
    path, saved = newest_checkpoint(args.checkpoints, world.device, world.rank)  # NEW
    if saved is None:  # NEW
        return 0, []  # NEW
    set_model_state_dict(model, saved["model"], options=FULL)  # FSDP2
    set_optimizer_state_dict(model, optimizer, saved["optimizer"], options=FULL)  # FSDP2
    if world.rank == 0:  # NEW
        print(f"resumed from {path.name}", flush=True)  # NEW
    return saved["step"], saved["losses"]  # NEW


def save(args, world, model, optimizer, done, losses):  # NEW: part 7, every K steps
    if args.checkpoints and done % args.every == 0:  # NEW
        state = {"model": get_model_state_dict(model, options=FULL),  # FSDP2: all ranks
                 "optimizer": get_optimizer_state_dict(model, optimizer, options=FULL),
                 "step": done, "losses": losses}  # FSDP2
        if world.rank == 0:  # NEW: one writer, atomically (lessons 04 and 23)
            save_atomic(state,  # FSDP2
                        Path(args.checkpoints) / f"step-{done:06d}.pt")  # NEW
        dist.barrier()  # NEW: saved before anyone goes on
    if (done == args.kill_at and world.rank == world.world_size - 1  # NEW
            and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):  # NEW: 1st attempt
        os.kill(os.getpid(), signal.SIGKILL)  # NEW: a crash: no clean-up, no error


def main():
    parser = options(__doc__)  # NEW: and the options of part 7
    parser.add_argument("--checkpoints", help="a folder: resume from it, save to it")  # NEW
    parser.add_argument("--every", type=int, default=20, help="steps between checkpoints")  # NEW
    parser.add_argument("--stop-at", type=int, help="stop after this step")  # NEW
    parser.add_argument("--kill-at", type=int, help="the last rank dies after this step")  # NEW
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world = setup(ddp=True, restarts=True)  # NEW: rank, world size, device; joins
    if args.batch % (args.micro * world.world_size):  # NEW
        sys.exit(f"--batch {args.batch} is not a multiple of --micro {args.micro} x "  # NEW
                 f"{world.world_size} ranks")  # NEW
    chars, train, validation = load()
    model = make_model(len(chars)).to(world.device)
    mesh = init_device_mesh(world.device.type, (world.world_size,))  # FSDP2: the ranks
    for block in model.blocks:  # FSDP2: each block's weights split over the ranks ...
        fully_shard(block, mesh=mesh)  # FSDP2
    fully_shard(model, mesh=mesh)  # FSDP2: ... and the rest (embedding, head, norm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    accumulate = args.batch // (args.micro * world.world_size)  # NEW: batch = micro x acc. x N
    before = generate(model, chars, PROMPT)  # FSDP2: on every rank (each gathers weights)
    meter = Meter()  # tokens trained on, per second
    start, losses = resume(args, world, model, optimizer)  # NEW
    for step in range(start, args.stop_at or args.steps):  # NEW: start, stop_at
        mine = global_batch(train, step, args.batch)[world.rank::world.world_size]  # NEW
        micro = [batch(mine[i::accumulate]) for i in range(accumulate)]
        tokens = sum((y != IGNORE).sum() for _, y in micro).to(world.device)  # NEW: .to
        meter.count(tokens.item())
        dist.all_reduce(tokens)  # NEW: the step's tokens, on all ranks
        step_loss = torch.zeros((), device=world.device)  # NEW: device
        for i, (x, y) in enumerate(micro):
            last = i == accumulate - 1  # NEW: gradients are exchanged after the last only
            model.set_requires_gradient_sync(last)  # FSDP2: in place of no_sync
            total, _ = loss_sum(model, x, y, bf16=not args.fp32)  # FSDP2: no with
            (total / tokens * world.world_size).backward()  # FSDP2: x N: FSDP2 averages
            step_loss += total.detach() / tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(step_loss)  # NEW: the whole batch's loss, for the log
        losses.append(step_loss.item())
        if world.rank == 0 and (step == 0 or (step + 1) % 40 == 0):  # NEW: rank 0
            print(f"step {step + 1:3d}  loss {losses[-1]:.3f}", flush=True)
        save(args, world, model, optimizer, step + 1, losses)  # NEW
    speed = meter.results() if meter.start else {}  # NEW: {} if resumed at the end
    val = evaluate(model, validation[world.rank::world.world_size],  # FSDP2: model
                   bf16=not args.fp32)
    if world.rank == 0:  # NEW
        print(f"validation: {val:.3f} nats per character")
    after = generate(model, chars, PROMPT)  # FSDP2: on every rank
    whole = make_model(len(chars))  # FSDP2: a plain copy with the whole weights
    whole.load_state_dict(get_model_state_dict(model, options=FULL))  # FSDP2
    write_results(args.out, whole, losses=losses, validation=val, **speed,  # FSDP2
                  before=before, after=after)
    del model, optimizer  # NEW: the model goes before the group (lesson 13)
    teardown()  # NEW


if __name__ == "__main__":
    main()
