"""Lesson 03, section 3: DDP on a real dataset, scikit-learn's digits, with
DistributedSampler and set_epoch, a loss reduced across ranks, rank-0 logging, and after
each epoch the test accuracy three ways (digits_data.train). With --alone, rank 0 then
trains the same model again in a group of one process, for the comparison.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/03_ddp_training/ddp_training.py
"""

import sys
import time

import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown, write_json
from digits_data import train


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
    world = setup(args.device, ddp=True)  # ddp=True: it builds a DDP model (lesson 02 says why)
    if args.batch % world.world_size:
        teardown()
        sys.exit(f"--batch {args.batch} must be divisible by the world size {world.world_size}")
    is_rank0 = world.rank == 0
    start, cpu = time.perf_counter(), time.process_time()
    found = train(world.rank, world.world_size, world.device, args, is_rank0)
    seconds = time.perf_counter() - start
    shares = [None] * world.world_size  # CPU seconds per second: under 1, others took turns
    dist.all_gather_object(shares, (time.process_time() - cpu) / seconds)
    found.update(world_size=world.world_size, batch=args.batch, seconds=seconds,
                 cpu_shares=shares)
    teardown()
    if is_rank0 and args.alone:  # the same training on one process, in a group of one
        dist.init_process_group(dist.get_default_backend_for_device(world.device),
                                store=dist.HashStore(), rank=0, world_size=1)
        start, cpu = time.perf_counter(), time.process_time()
        alone = train(0, 1, world.device, args, is_rank0=False)
        seconds = time.perf_counter() - start
        found["alone"] = {"history": alone["history"], "weights": alone["weights"],
                          "seconds": seconds, "cpu_share": (time.process_time() - cpu) / seconds}
        teardown()
    if is_rank0 and args.out:
        write_json(args.out, found)


if __name__ == "__main__":
    main()
