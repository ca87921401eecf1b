"""Exercise (lesson 00, DDP in ten minutes): make this plain training script a DDP
script. The check launches it on several ranks and compares it with the plain run.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/00_ddp_in_ten_minutes/ddp_exercise.py
"""

import os
import sys

import torch
import torch._dynamo  # noqa: F401  (imported before joining: lesson 06 says why)
import torch.distributed as dist
import torch.nn.functional as F

# STUB: from ddp_common import write_results
# STUB: from digits_cnn import Meter, load_data, make_model, parse_args, test_accuracy
# STUB: from torch.utils.data import DataLoader, RandomSampler
### BEGIN SOLUTION
from ddp_common import write_results
from digits_cnn import Meter, load_data, make_model, parse_args, test_accuracy
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

### END SOLUTION


def main():
    args = parse_args(__doc__)
    torch.set_num_threads(args.threads)
    # STUB: device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # STUB: train_set, test = load_data()
    # STUB: torch.manual_seed(0)
    # STUB: model = make_model().to(device)
    # STUB: optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    # STUB: sampler = RandomSampler(train_set, generator=torch.Generator())
    # STUB: loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    # STUB: meter = Meter()
    # STUB: for epoch in range(args.epochs):
    # STUB:     sampler.generator.manual_seed(epoch)
    ### BEGIN SOLUTION
    if "LOCAL_RANK" not in os.environ:
        sys.exit(f"start it with torchrun: torchrun --nproc-per-node=2 {sys.argv[0]}")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device))
    world_size = dist.get_world_size()
    if args.batch % world_size:
        sys.exit(f"--batch {args.batch} does not split evenly over {world_size} ranks")
    train_set, test = load_data()
    torch.manual_seed(0)
    model = DDP(make_model().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    sampler = DistributedSampler(train_set, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch // world_size, sampler=sampler)
    meter = Meter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
    ### END SOLUTION
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            meter.count(len(y))
        accuracy = test_accuracy(model, test, device)
        print(f"epoch {epoch}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    write_results(args.out, model, accuracy=accuracy, **meter.results())
    ### BEGIN SOLUTION
    del model, optimizer
    dist.destroy_process_group()
    ### END SOLUTION


if __name__ == "__main__":
    main()
