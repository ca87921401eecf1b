"""Lesson 03, section 1: what a DistributedSampler hands each rank of the
digits' training set: its shard, the same order again without set_epoch, and a new order
after set_epoch(1).

    torchrun --standalone --nproc-per-node=2 ddp_scripts/03_ddp_training/sampler.py
"""

from ddp_common import arguments, record, report, setup, teardown
from digits_data import load_data
from torch.utils.data import DistributedSampler


def sampler_facts(train, rank, world_size, seed):
    """What DistributedSampler hands this rank: its shard, and its order per epoch."""
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, seed=seed)
    epoch0 = list(sampler)
    again = list(sampler)  # no set_epoch: the same order again
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    return {"shard": epoch0, "repeat_without_set_epoch": again == epoch0,
            "differs_after_set_epoch": epoch1 != epoch0}


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device)
    train, test = load_data(seed=0)
    report(args.out, sampler_facts(train, world.rank, world.world_size, seed=0),
           train_size=len(train), test_size=len(test))
    teardown()


if __name__ == "__main__":
    main()
