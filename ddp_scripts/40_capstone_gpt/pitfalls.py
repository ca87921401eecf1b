"""Lesson 40 (capstone): two reductions that are wrong without any error, each beside its
fix and beside one process (part 5): a padded batch's loss averaged per rank, and an
evaluation through a padding sampler. On the weights of a trained model.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/40_capstone_gpt/pitfalls.py --weights FILE
"""

import sys

import torch
import torch.distributed as dist
from ddp_common import arguments, report, setup, teardown
from gpt import make_model
from gpt_data import batch, global_batch, load
from gpt_train import loss_sum
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler


def gradient(model):
    """All gradients as one vector; then zeroed for the next backward."""
    found = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    return found


def gaps(plain, model, pieces, rank, n):
    """One global batch's gradient, two ways, against one process's. Relative:
    the largest difference over the largest gradient."""
    total, count = loss_sum(plain, *batch(pieces), bf16=False)
    (total / count).backward()  # one process: every rank works it out alone
    one_process = gradient(plain)
    x, y = batch(pieces[rank::n])  # this rank's share
    total, count = loss_sum(model, x, y, bf16=False)
    (total / count).backward()  # this rank's mean; DDP averages the means
    mean_of_means = gradient(model)
    tokens = count.clone()
    dist.all_reduce(tokens)  # the fix: the tokens of all ranks ...
    total, count = loss_sum(model, x, y, bf16=False)
    (total / tokens * n).backward()  # ... divide once; x n undoes DDP's average
    token_mean = gradient(model)
    scale = one_process.abs().max()
    return int(count), {"mean_of_means": ((mean_of_means - one_process).abs().max() / scale).item(),
                        "token_mean": ((token_mean - one_process).abs().max() / scale).item()}


@torch.no_grad()
def losses(model, validation, rank, n):
    """The validation loss three ways."""
    total, count = loss_sum(model, *batch(validation), bf16=False)
    one_process = (total / count).item()
    sampler = DistributedSampler(validation, num_replicas=n, rank=rank, shuffle=False)
    padded = [validation[i] for i in sampler]  # pads by repeating the first windows
    total, count = loss_sum(model, *batch(padded), bf16=False)
    naive = (total / count).reshape(1)
    dist.all_reduce(naive)  # the sum of the ranks' means, with repeats
    share = validation[rank::n]  # every window once, none twice
    total, count = loss_sum(model, *batch(share), bf16=False)
    sums = torch.stack([total, count.float()])
    dist.all_reduce(sums)
    return len(padded), len(share), {"one_process": one_process, "naive": naive.item() / n,
                                     "exact": (sums[0] / sums[1]).item()}


def main():
    parser = arguments(__doc__, device=False)
    parser.add_argument("--weights", help="a checkpoint of gpt_ddp.py")
    args = parser.parse_args()
    world = setup("cpu", ddp=True)
    if not args.weights:
        sys.exit("--weights FILE: a checkpoint that gpt_ddp.py --checkpoints saved")
    chars, train, validation = load()
    weights = torch.load(args.weights, weights_only=True)["model"]
    plain = make_model(len(chars))
    plain.load_state_dict(weights)
    model = DDP(make_model(len(chars)))
    model.module.load_state_dict(weights)
    tokens, gradients = gaps(plain, model, global_batch(train, 0, 24), world.rank,
                             world.world_size)
    padded, share, evaluations = losses(plain, validation, world.rank, world.world_size)
    report(args.out, {"tokens": tokens, "padded": padded, "share": share},
           **gradients, **evaluations)
    del model
    teardown()


if __name__ == "__main__":
    main()
