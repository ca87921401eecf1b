"""Lesson 40 (capstone): the text the GPT learns, cut into windows of one paragraph.
Run on its own, it prints (and with --out writes) what the data holds:

    python ddp_scripts/40_capstone_gpt/gpt_data.py
"""

import argparse
import json
from pathlib import Path
from pydoc_data import topics

import torch

CONTEXT = 64  # characters a window predicts, each from the ones before it
IGNORE = -100  # the target of a padded position: cross_entropy skips it
VALIDATION_WINDOWS = 245  # = 5 x 7 x 7: divisible by none of 2, 3 and 4


def documents():
    """The help texts of pydoc_data.topics, by name; every fifth is for validation."""
    names = sorted(topics.topics)
    train = [topics.topics[n] for i, n in enumerate(names) if i % 5 != 4]
    validation = [topics.topics[n] for i, n in enumerate(names) if i % 5 == 4]
    return train, validation


def vocabulary():
    """Every character of the texts, in code-point order: character i is token i."""
    return sorted(set("".join(topics.topics.values())))


def windows(texts, chars):
    """Each paragraph cut into windows of CONTEXT + 1 characters, the last one shorter."""
    index = {c: i for i, c in enumerate(chars)}
    found = []
    for text in texts:
        for paragraph in text.split("\n\n"):
            for start in range(0, len(paragraph), CONTEXT + 1):
                piece = paragraph[start:start + CONTEXT + 1]
                if len(piece.strip()) > 1:  # a window needs an input and a target
                    found.append(torch.tensor([index[c] for c in piece]))
    return found


def load():
    chars, (train, validation) = vocabulary(), documents()
    return chars, windows(train, chars), windows(validation, chars)[:VALIDATION_WINDOWS]


def batch(pieces):
    """Inputs and targets, padded to CONTEXT: a padded target is IGNORE."""
    x = torch.zeros(len(pieces), CONTEXT, dtype=torch.long)
    y = torch.full((len(pieces), CONTEXT), IGNORE, dtype=torch.long)
    for i, piece in enumerate(pieces):
        x[i, :len(piece) - 1] = piece[:-1]
        y[i, :len(piece) - 1] = piece[1:]
    return x, y


def global_batch(train, step, size):
    """The windows of step `step`: the same on every rank, in every run, after a resume."""
    per_pass = len(train) // size
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(step // per_pass))
    start = (step % per_pass) * size
    return [train[i] for i in order[start:start + size].tolist()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write what the data holds here, as JSON")
    args = parser.parse_args()
    chars, train, validation = load()
    facts = {"documents": len(topics.topics), "vocabulary": len(chars),
             "characters": sum(len(text) for text in topics.topics.values()),
             "lengths": [len(w) for w in train], "validation": len(validation)}
    print(f"{facts['documents']} documents, {facts['characters']:,} characters, {len(chars)} "
          f"different; {len(train):,} training windows, {len(validation)} validation windows")
    if args.out:
        Path(args.out).write_text(json.dumps(facts))
