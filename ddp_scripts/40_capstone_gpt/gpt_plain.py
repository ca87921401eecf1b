"""Lesson 40 (capstone): a small GPT trained on Python's documentation, one process.

    python ddp_scripts/40_capstone_gpt/gpt_plain.py
"""

import torch
from ddp_common import write_results
from digits_cnn import Meter
from gpt import make_model
from gpt_data import IGNORE, batch, global_batch, load
from gpt_train import generate, learning_rate, loss_sum, options

PROMPT = "The "


@torch.no_grad()
def evaluate(model, windows, bf16):
    """Nats per character: the summed loss of the windows over their counted tokens."""
    model.eval()
    total, count = loss_sum(model, *batch(windows), bf16)
    model.train()
    return (total / count).item()


def main():
    args = options(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    chars, train, validation = load()
    model = make_model(len(chars))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    accumulate = args.batch // args.micro  # micro-batches per optimizer step
    before = generate(model, chars, PROMPT)
    losses, meter = [], Meter()  # tokens trained on, per second
    for step in range(args.steps):
        mine = global_batch(train, step, args.batch)
        micro = [batch(mine[i::accumulate]) for i in range(accumulate)]
        tokens = sum((y != IGNORE).sum() for _, y in micro)  # the step's tokens
        meter.count(tokens.item())
        step_loss = torch.zeros(())
        for x, y in micro:
            total, _ = loss_sum(model, x, y, bf16=not args.fp32)
            (total / tokens).backward()  # summed over micro-batches: the mean per token
            step_loss += total.detach() / tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(step_loss.item())
        if step == 0 or (step + 1) % 40 == 0:
            print(f"step {step + 1:3d}  loss {losses[-1]:.3f}", flush=True)
    speed = meter.results()
    val = evaluate(model, validation, bf16=not args.fp32)
    print(f"validation: {val:.3f} nats per character")
    write_results(args.out, model, losses=losses, validation=val, **speed, before=before,
                  after=generate(model, chars, PROMPT))


if __name__ == "__main__":
    main()
