"""Exercise (lesson 11): place the stages so that a replica's two stages sit on
neighbouring ranks (rank 2k runs stage 0 of replica k, rank 2k + 1 its stage 1), as you
would put them on the GPUs of one node, and give each stage's DDP a group with that
stage's ranks. The training around it is in pipeline_harness.py.
    torchrun --standalone --nproc-per-node=4 ddp_scripts/11_placement_exercise.py
"""

import torch.distributed as dist
from pipeline_harness import run_exercise


def place(rank, world_size):
    """Returns (stage, replica, partner, group) for this rank; 2 stages."""
    # STUB: replicas = world_size // 2
    # STUB: stage, replica = divmod(rank, replicas)  # the lesson's layout: stage by stage
    # STUB: partner = (1 - stage) * replicas + replica
    # STUB: groups = [dist.new_group(list(range(s * replicas, (s + 1) * replicas)))
    # STUB:           for s in range(2)]
    ### BEGIN SOLUTION
    replica, stage = divmod(rank, 2)  # ranks 2k, 2k + 1: replica k's two stages
    partner = rank + 1 if stage == 0 else rank - 1
    groups = [dist.new_group(list(range(s, world_size, 2))) for s in range(2)]  # all ranks
    ### END SOLUTION
    return stage, replica, partner, groups[stage]


if __name__ == "__main__":
    run_exercise(place)
