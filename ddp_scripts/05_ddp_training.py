"""Lesson 05 in practice, section 3: DDP on a real dataset, scikit-learn's digits, with
DistributedSampler and set_epoch, a loss reduced across ranks, rank-0 logging, and after
each epoch the test accuracy three ways (digits_data.evaluate). With --alone, rank 0 then
trains the same model again in a group of one process, for the comparison.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/05_ddp_training.py
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_common import arguments, record, setup, teardown, write_json
from digits_data import evaluate, load_data, make_model
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def train(rank, world_size, device, args, is_rank0):
    """The training loop; the DDP model is gone when this returns (lesson 05)."""
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
        scores = evaluate(model.module, test_set, rank, world_size, device)
        history.append({"epoch": epoch, "train_loss": (loss_sum[0] / loss_sum[1]).item(),
                        **scores})
        if is_rank0:  # one line per epoch, not one per rank
            print(f"epoch {epoch:2}: loss {history[-1]['train_loss']:.4f}, "
                  f"test accuracy {scores['reduced']:.4f}", flush=True)
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return {"history": history, "weights": weights.tolist(), "steps_per_epoch": len(loader),
            "train_size": len(train_set), "test_size": len(test_set)}


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=48,
                        help="global batch (all ranks; 48 splits evenly over 1 to 4 ranks)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", action="store_true",
                        help="then rank 0 trains the same model again, on its own")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: lesson 05, "A clean exit"
    if args.batch % world.world_size:
        teardown()
        sys.exit(f"--batch {args.batch} must be divisible by the world size {world.world_size}")
    is_rank0 = world.rank == 0
    start = time.perf_counter()
    found = train(world.rank, world.world_size, world.device, args, is_rank0)
    found.update(world_size=world.world_size, batch=args.batch,
                 seconds=time.perf_counter() - start)
    teardown()
    if is_rank0 and args.alone:  # the same training on one process, in a group of one
        dist.init_process_group(dist.get_default_backend_for_device(world.device),
                                store=dist.HashStore(), rank=0, world_size=1)
        start = time.perf_counter()
        alone = train(0, 1, world.device, args, is_rank0=False)
        found["alone"] = {"history": alone["history"], "weights": alone["weights"],
                          "seconds": time.perf_counter() - start}
        teardown()
    if is_rank0 and args.out:
        write_json(args.out, found)


if __name__ == "__main__":
    main()
