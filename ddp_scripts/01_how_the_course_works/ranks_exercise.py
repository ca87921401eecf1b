"""Exercise (lesson 01, how the course works): every rank says where it runs.

Complete where_am_i() from the variables torchrun sets. Each rank then joins the
group and sends its answer, with the numbers the process group itself gives, to
rank 0, which writes them all as JSON with --out. The check starts the script as
a job on two nodes (two torchrun agents on this machine) and compares.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/01_how_the_course_works/ranks_exercise.py
"""

import os

import torch.distributed as dist
from ddp_common import arguments, report, setup, teardown
from torch.distributed.elastic.multiprocessing.errors import record


def where_am_i():
    """This process's place in the job, as ints: {"rank", "local_rank", "node",
    "world_size"}. It must hold on any number of nodes, not only on one."""
    # STUB: rank = int(os.environ["RANK"])
    # STUB: return {"rank": rank, "local_rank": rank, "node": 0,  # right on one node only
    # STUB:         "world_size": int(os.environ["WORLD_SIZE"])}
    ### BEGIN SOLUTION
    return {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]),
            "node": int(os.environ["GROUP_RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}
    ### END SOLUTION


@record
def main():
    args = arguments(__doc__).parse_args()
    setup(args.device)
    answer = where_am_i()
    group = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
             "nodes": int(os.environ["GROUP_WORLD_SIZE"])}  # what the group says
    print(f"rank {group['rank']} answers {answer}")
    report(args.out, {"answer": answer, "group": group})  # rank 0 writes every rank's
    teardown()


if __name__ == "__main__":
    main()
