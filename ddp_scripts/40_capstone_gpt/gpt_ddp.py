"""Lesson 40 (capstone): the small GPT trained with DDP; the new lines are marked.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/40_capstone_gpt/gpt_ddp.py
"""

import os  # NEW
import signal  # NEW
import sys  # NEW
from contextlib import nullcontext  # NEW
from pathlib import Path  # NEW

import torch
import torch.distributed as dist  # NEW
from ddp_common import setup, teardown, write_results  # NEW
from digits_cnn import Meter
from gpt import make_model
from gpt_data import IGNORE, batch, global_batch, load
from gpt_train import generate, learning_rate, loss_sum, options
from resuming import newest_checkpoint, save_atomic  # NEW: lesson 23's
from torch.nn.parallel import DistributedDataParallel as DDP  # NEW

PROMPT = "The "


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
    model.module.load_state_dict(saved["model"])  # NEW
    optimizer.load_state_dict(saved["optimizer"])  # NEW
    if world.rank == 0:  # NEW
        print(f"resumed from {path.name}", flush=True)  # NEW
    return saved["step"], saved["losses"]  # NEW


def save(args, world, model, optimizer, done, losses):  # NEW: part 7, every K steps
    if args.checkpoints and done % args.every == 0:  # NEW
        if world.rank == 0:  # NEW: one writer, atomically (lessons 04 and 23)
            save_atomic({"model": model.module.state_dict(), "step": done,  # NEW
                         "optimizer": optimizer.state_dict(), "losses": losses},  # NEW
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
    model = DDP(make_model(len(chars)).to(world.device))  # NEW
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    accumulate = args.batch // (args.micro * world.world_size)  # NEW: batch = micro x acc. x N
    before = generate(model.module, chars, PROMPT)  # NEW: .module
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
            with nullcontext() if last else model.no_sync():  # NEW
                total, _ = loss_sum(model, x, y, bf16=not args.fp32)
                (total / tokens * world.world_size).backward()  # NEW: x N: DDP averages
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
    val = evaluate(model.module, validation[world.rank::world.world_size],  # NEW: a share
                   bf16=not args.fp32)
    if world.rank == 0:  # NEW
        print(f"validation: {val:.3f} nats per character")
    after = generate(model.module, chars, PROMPT) if world.rank == 0 else None  # NEW
    write_results(args.out, model.module, losses=losses, validation=val, **speed,  # NEW
                  before=before, after=after)
    del model, optimizer  # NEW: the model goes before the group (lesson 13)
    teardown()  # NEW


if __name__ == "__main__":
    main()
