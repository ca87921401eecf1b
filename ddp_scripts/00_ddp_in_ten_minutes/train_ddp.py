"""Lesson 00 (DDP in ten minutes): the plain script with DDP; the new lines are marked.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/00_ddp_in_ten_minutes/train_ddp.py
"""

import sys  # NEW

import torch
import torch.nn.functional as F
from ddp_common import setup, teardown, write_results  # NEW
from digits_cnn import Meter, load_data, make_model, parse_args, test_accuracy
from torch.nn.parallel import DistributedDataParallel as DDP  # NEW
from torch.utils.data import DataLoader, DistributedSampler  # NEW


def main():
    args = parse_args(__doc__)
    torch.set_num_threads(args.threads)
    world = setup(ddp=True)  # NEW: join the job: rank, world size, device
    device = world.device  # NEW: cuda:LOCAL_RANK on GPUs, else the CPU
    if args.batch % world.world_size:  # NEW: equal shares
        sys.exit(f"--batch {args.batch} does not split evenly over {world.world_size} ranks")
    train_set, test = load_data()
    torch.manual_seed(0)
    model = DDP(make_model().to(device))  # NEW: copies rank 0's weights; averages gradients
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    sampler = DistributedSampler(train_set, seed=0)  # NEW: 1/N of the data
    loader = DataLoader(train_set, batch_size=args.batch // world.world_size,  # NEW
                        sampler=sampler)
    meter = Meter()  # samples trained on, per second
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # NEW: the same new order on every rank
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.count(len(y))
        accuracy = test_accuracy(model, test, device)
        if world.rank == 0:  # NEW: one line, not N
            print(f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    found = meter.results()
    print(f"trained on {found['samples']} samples, {found['per_second']:.0f} per second")
    write_results(args.out, model, accuracy=accuracy, **found)
    del model, optimizer  # NEW: else freeing it after teardown can hang (torch 2.13)
    teardown()  # NEW: leave the job


if __name__ == "__main__":
    main()
