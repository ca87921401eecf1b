"""Lesson 40 (capstone): what the training scripts share besides the data and the model:
the loss, the learning-rate schedule, the text the model writes, and the options."""

import argparse
import math

import torch
import torch.nn.functional as F
from gpt_data import CONTEXT, IGNORE


def loss_sum(model, x, y, bf16=True):
    """The summed loss of the real (not padded) tokens, and their count, on the model's
    device. bf16: the matrix products in bfloat16 (autocast), the loss in float32."""
    device = next(model.parameters()).device
    x, y = x.to(device), y.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    total = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                            reduction="sum")
    return total, (y != IGNORE).sum()


def learning_rate(step, steps, peak, warm_up=10):
    """Linear warm-up over `warm_up` steps, then a cosine down to a tenth of `peak`."""
    if step < warm_up:
        return peak * (step + 1) / warm_up
    progress = (step - warm_up) / max(1, steps - warm_up)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def generate(model, chars, prompt, length=120, temperature=0.8):
    """`length` characters after `prompt`, each drawn from the model's prediction (a
    seeded draw: the same model writes the same text)."""
    index = {c: i for i, c in enumerate(chars)}
    device = next(model.parameters()).device
    draws = torch.Generator(device=device).manual_seed(0)
    x = torch.tensor([[index[c] for c in prompt]], device=device)
    for _ in range(length):
        logits = model(x[:, -CONTEXT:])[0, -1].float() / temperature
        following = torch.multinomial(logits.softmax(-1), 1, generator=draws)
        x = torch.cat([x, following.view(1, 1)], dim=1)
    return "".join(chars[i] for i in x[0, len(prompt):].tolist())


def options(doc):
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=24, help="windows per optimizer step")
    parser.add_argument("--micro", type=int, default=6, help="windows per forward/backward")
    parser.add_argument("--lr", type=float, default=4e-3, help="peak learning rate")
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the results as JSON here")
    return parser
