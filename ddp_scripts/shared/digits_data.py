"""Lesson 03: scikit-learn's handwritten digits (1797 images of 8x8 pixels,
shipped with the package: no download), split the same way on every rank, a small model
its accuracy measured across ranks, and its DDP training loop. Imported by lesson 03's
scripts, and by lesson 32's, which trains it on two hosts."""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

TEST_SIZE = 357  # of 1797: leaves 1440 for training, divisible by 1, 2, 3 and 4 ranks


def load_data(seed=0):
    """The digits, shuffled once with a fixed seed (the same on every rank), then split."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float64)  # pixels 0..16 -> 0..1
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    test = TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE])
    return TensorDataset(x[TEST_SIZE:], y[TEST_SIZE:]), test


def make_model(seed=0):
    """A small two-layer network, in float64 so that runs with different numbers of ranks
    can be compared closely."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).double()


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
    """The training loop; the DDP model is gone when this returns (lesson 02 says why)."""
    train_set, test_set = load_data(args.seed)
    model = make_model(args.seed).to(device)
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
        # model.module: the model inside the wrapper, whose forward starts no collective
        scores = evaluate(model.module, test_set, rank, world_size, device)
        history.append({"epoch": epoch, "train_loss": (loss_sum[0] / loss_sum[1]).item(),
                        **scores})
        if is_rank0:  # one line per epoch, not one per rank
            print(f"epoch {epoch:2}: loss {history[-1]['train_loss']:.4f}, "
                  f"test accuracy {scores['reduced']:.4f}", flush=True)
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return {"history": history, "weights": weights.tolist(), "steps_per_epoch": len(loader),
            "train_size": len(train_set), "test_size": len(test_set)}
