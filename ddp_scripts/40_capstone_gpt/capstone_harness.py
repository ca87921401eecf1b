"""Lesson 40 (capstone): what runs a learner's answers to the two exercises, on the
lesson's GPT (its embedding tied to its output layer) or on a variant, and compares them
with one process. The exercises' scripts import it; on its own it does nothing.

--model tied: the lesson's GPT. --model frozen: embeddings not tied, the last LayerNorm's
bias frozen, and a layer that no step uses (their gradients stay None).
"""

import torch
import torch.nn as nn
from ddp_common import arguments, report, setup, teardown
from gpt import make_model
from gpt_data import batch, global_batch, load
from gpt_train import learning_rate, loss_sum


def model_for(kind, vocab):
    model = make_model(vocab, tied=kind == "tied")
    if kind == "frozen":
        model.norm.bias.requires_grad_(False)
        model.unused = nn.Linear(4, 4)  # forward never calls it
    return model


def options(doc):
    parser = arguments(doc, device=False)
    parser.add_argument("--model", choices=["tied", "frozen"], default="tied")
    return parser.parse_args()


def run_token_exercise(reduce_gradients, doc):
    """Every rank runs backward on the summed loss of its share of one global batch, then
    the learner's reduce_gradients(model, tokens); each gradient is compared with the one
    one process gets from the whole batch's mean loss per token."""
    args = options(doc)
    world = setup("cpu")
    chars, train, _ = load()
    pieces = global_batch(train, 3, 24)  # 24 windows of different lengths
    alone = model_for(args.model, len(chars))
    total, count = loss_sum(alone, *batch(pieces), bf16=False)
    (total / count).backward()
    model = model_for(args.model, len(chars))
    x, y = batch(pieces[world.rank::world.world_size])
    total, tokens = loss_sum(model, x, y, bf16=False)
    total.backward()  # the sum of this rank's losses
    reduce_gradients(model, tokens)
    gaps, none = {}, []
    for (name, want), got in zip(alone.named_parameters(), model.parameters()):
        if want.grad is None:  # frozen, or unused: one process has no gradient either
            if got.grad is not None and got.grad.abs().max() > 0:
                none.append(name)
            continue
        if got.grad is None:
            gaps[name] = float("inf")
            continue
        gaps[name] = ((got.grad - want.grad).abs().max() / want.grad.abs().max()).item()
    report(args.out, {"gaps": gaps, "not_none": none, "tokens": int(tokens)},
           model=args.model)
    teardown()


def run_eval_exercise(evaluate, doc):
    """Every rank trains the same model alone for a few steps (no communication), then
    calls the learner's evaluate(model, windows) on all validation windows, and also
    evaluates them alone: the one-process answer."""
    args = options(doc)
    setup("cpu")
    chars, train, validation = load()
    model = model_for(args.model, len(chars))
    optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    for step in range(15):  # different windows now get different losses
        total, count = loss_sum(model, *batch(global_batch(train, step, 24)), bf16=False)
        (total / count).backward()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, 15, 4e-3, warm_up=3)
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        total, count = loss_sum(model, *batch(validation), bf16=False)
        found = evaluate(model, validation)
    report(args.out, {"loss": found}, one_process=(total / count).item(),
           windows=len(validation), model=args.model)
    teardown()
