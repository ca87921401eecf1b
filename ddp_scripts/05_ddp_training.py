"""Lesson 05, part 2: DDP in practice, on a real dataset.

Trains a small network on scikit-learn's handwritten digits (shipped with the
package: 1797 images of 8x8 pixels, no download) with DistributedSampler, set_epoch,
metrics reduced across ranks and rank-0 logging. Before training it records what the
sampler hands each rank; after each epoch it evaluates on the test set three ways:
on one process, and split across the ranks both naively and correctly. The model is
in float64 so that runs with different world sizes can be compared closely; with
--alone, rank 0 then trains it again in a group of one process, for that comparison.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_ddp_training.py
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from ddp_common import record, require_torchrun, setup, teardown
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TEST_SIZE = 357  # of 1797: leaves 1440 for training, divisible by 1, 2, 3 and 4 ranks


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=48,
                        help="global batch (all ranks; 48 splits evenly over 1 to 4 ranks)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", action="store_true",
                        help="then rank 0 trains the same model again, on its own")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    return parser.parse_args()


def load_data(seed):
    """The digits, shuffled once with a fixed seed (the same on every rank), then split."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float64)  # pixels 0..16 -> 0..1
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    test = TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE])
    return TensorDataset(x[TEST_SIZE:], y[TEST_SIZE:]), test


def sampler_facts(train, rank, world_size, seed):
    """What DistributedSampler hands each rank: its shard, and its order per epoch."""
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=seed)
    epoch0 = list(sampler)
    again = list(sampler)  # no set_epoch: the same order again
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    return {"shard": epoch0, "repeat_without_set_epoch": again == epoch0,
            "differs_after_set_epoch": epoch1 != epoch0}


def correct_answers(model, x, y, device):
    """1 for each sample the model gets right, 0 otherwise (model is the plain module:
    evaluation needs no gradients, so no DDP and no collectives in its forward)."""
    with torch.no_grad():
        return (model(x.to(device)).argmax(1) == y.to(device)).double()


def evaluate(model, test, rank, world_size, device):
    """Accuracy on the test set, three ways (every rank holds the same weights)."""
    x, y = test.tensors
    single = correct_answers(model, x, y, device).mean().item()  # one process, all of it

    # Naive: DistributedSampler pads the shards to equal size, and each rank's accuracy
    # is averaged as if the shards were disjoint and equal.
    padded = list(DistributedSampler(test, num_replicas=world_size, rank=rank, shuffle=False))
    mine = torch.stack([correct_answers(model, x[padded], y[padded], device).mean(),
                        torch.tensor(len(padded), dtype=torch.float64, device=device)])
    dist.all_reduce(mine)
    naive, naive_count = mine[0].item() / world_size, int(mine[1].item())

    # Right: disjoint, unpadded shards; all-reduce the sums and the counts, divide once.
    shard = list(range(rank, len(y), world_size))
    totals = torch.stack([correct_answers(model, x[shard], y[shard], device).sum(),
                          torch.tensor(len(shard), dtype=torch.float64, device=device)])
    dist.all_reduce(totals)
    return {"single": single, "naive": naive, "naive_count": naive_count,
            "reduced": totals[0].item() / totals[1].item(), "reduced_count": int(totals[1])}


def train(rank, world_size, device, args, is_rank0):
    """The training loop; the DDP model is gone when this returns (lesson 05, part 1)."""
    train_set, test_set = load_data(args.seed)
    facts = sampler_facts(train_set, rank, world_size, args.seed)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).double().to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch // world_size, sampler=sampler)
    history = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        model.train()
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, n
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum[0] += loss.detach() * len(y)  # stays on the device: no sync per step
            loss_sum[1] += len(y)
        dist.all_reduce(loss_sum)  # the epoch's mean loss over all ranks' samples
        model.eval()
        scores = evaluate(model.module, test_set, rank, world_size, device)
        history.append({"epoch": epoch, "train_loss": (loss_sum[0] / loss_sum[1]).item(),
                        **scores})
        if is_rank0:  # one line per epoch, not one per rank
            print(f"epoch {epoch:2}: loss {history[-1]['train_loss']:.4f}, "
                  f"test accuracy {scores['reduced']:.4f}", flush=True)
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    sizes = {"train_size": len(train_set), "test_size": len(test_set),
             "steps_per_epoch": len(loader)}
    return facts, history, weights.tolist(), sizes


@record
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    is_rank0 = rank == 0
    if args.batch % world_size:
        sys.exit(f"--batch {args.batch} must be divisible by the world size {world_size}")

    device = setup(ddp=True).device  # lessons 01 and 05: checks, device, process group
    start = time.perf_counter()
    facts, history, weights, sizes = train(rank, world_size, device, args, is_rank0)
    found = {"world_size": world_size, "batch": args.batch, **sizes, "history": history,
             "weights": weights, "seconds": time.perf_counter() - start}
    found["sampler"] = [None] * world_size
    dist.all_gather_object(found["sampler"], facts)
    teardown()
    if is_rank0 and args.alone:  # the same training on one process, in a group of one
        dist.init_process_group(dist.get_default_backend_for_device(device),
                                store=dist.HashStore(), rank=0, world_size=1)
        start = time.perf_counter()
        _, history, weights, _ = train(0, 1, device, args, is_rank0=False)
        found["alone"] = {"history": history, "weights": weights,
                          "seconds": time.perf_counter() - start}
        teardown()
    if is_rank0 and args.out:
        with open(args.out, "w") as f:
            json.dump(found, f)


if __name__ == "__main__":
    main()
