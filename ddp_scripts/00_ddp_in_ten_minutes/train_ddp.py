"""Lesson 00 (DDP in ten minutes): the plain script with DDP; the new lines are marked.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/00_ddp_in_ten_minutes/train_ddp.py
"""

import os  # NEW
import sys  # NEW

import torch
import torch._dynamo  # noqa: F401  NEW: torch 2.13: before joining, or Gloo can abort at exit
import torch.distributed as dist  # NEW
import torch.nn.functional as F
from ddp_common import write_results  # the course's: results as JSON for its checks
from digits_cnn import Meter, load_data, make_model, parse_args, test_accuracy
from torch.nn.parallel import DistributedDataParallel as DDP  # NEW
from torch.utils.data import DataLoader, DistributedSampler  # NEW


def main():
    args = parse_args(__doc__)
    torch.set_num_threads(args.threads)
    if "LOCAL_RANK" not in os.environ:  # NEW: torchrun sets it, and RANK and WORLD_SIZE
        sys.exit(f"start it with torchrun: torchrun --nproc-per-node=2 {sys.argv[0]}")
    if torch.cuda.is_available():  # NEW: one GPU per process: the one of its local rank
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device))  # NEW: join
    rank, world_size = dist.get_rank(), dist.get_world_size()  # NEW
    if args.batch % world_size:  # NEW: equal shares
        sys.exit(f"--batch {args.batch} does not split evenly over {world_size} ranks")
    train_set, test = load_data()
    torch.manual_seed(0)
    model = DDP(make_model().to(device))  # NEW: copies rank 0's weights; averages gradients
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    sampler = DistributedSampler(train_set, seed=0)  # NEW: 1/N of the data
    loader = DataLoader(train_set, batch_size=args.batch // world_size,  # NEW
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
        loss = loss.detach()  # NEW: this rank's half of the batch; averaged over the ranks,
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # NEW: the whole batch's loss
        if rank == 0:  # NEW: one line, not N
            print(f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    found = meter.results()
    print(f"trained on {found['samples']} samples, {found['per_second']:.0f} per second")
    write_results(args.out, model, accuracy=accuracy, **found)
    del model, optimizer  # NEW: torch 2.13: DDP before the group, or Gloo can hang at exit
    dist.destroy_process_group()  # NEW: leave the job


if __name__ == "__main__":
    main()
