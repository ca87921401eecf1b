"""Lesson 40 (capstone): the model, a small decoder-only transformer. Run on its own, it
counts the parameters and checks that a prediction sees only the past:

    python ddp_scripts/40_capstone_gpt/gpt.py
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from gpt_data import CONTEXT, vocabulary


class Block(nn.Module):  # causal self-attention, then an MLP, each added to its input
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # sees only the past
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token and position embeddings, `layers` blocks, and an output layer that shares its
    weight with the token embedding (tied, as in GPT-2)."""

    def __init__(self, vocab, width=64, layers=2, heads=4, tied=True):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(CONTEXT, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        if tied:
            self.head.weight = self.tokens.weight  # one tensor, two uses
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, x):
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def make_model(vocab, tied=True):
    torch.manual_seed(0)  # every rank and every run starts from the same weights
    return GPT(vocab, tied=tied)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the findings here, as JSON")
    args = parser.parse_args()
    vocab = len(vocabulary())
    model, x = make_model(vocab), torch.randint(vocab, (1, CONTEXT))
    changed = x.clone()
    changed[0, 40:] = (x[0, 40:] + 1) % vocab  # another future, from position 40 on
    with torch.no_grad():
        gaps = (model(x) - model(changed)).abs().amax(dim=(0, 2))  # per position
    found = {"parameters": sum(p.numel() for p in model.parameters()),
             "past": gaps[:40].max().item(), "future": gaps[40:].min().item()}
    print(f"{found['parameters']:,} parameters; changing characters 40 to 63 moved the "
          f"predictions at 0-39 by {found['past']:.1e}, at 40-63 by at least {found['future']:.1e}")
    if args.out:
        Path(args.out).write_text(json.dumps(found))
