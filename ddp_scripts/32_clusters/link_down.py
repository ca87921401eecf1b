"""Lesson 32: a link goes down during a job. The ranks all-reduce a one once a step; at
step --link-down-at the last rank takes its host's eth0 down, and the others wait for the
process group's --timeout. Needs root on a host of its own (lesson 32's two hosts).

    RANK=0 ... python ddp_scripts/32_clusters/link_down.py --link-down-at 3 --timeout 3   # on nodeA
"""

import subprocess
import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, setup, teardown


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--link-down-at", type=int, default=3, metavar="STEP",
                        help="the step at which the last rank's link goes down")
    parser.add_argument("--timeout", type=float, default=30,
                        help="seconds a collective waits before it fails")
    args = parser.parse_args()
    world = setup(args.device, timeout_s=args.timeout)
    for step in range(1000):  # until something fails
        if step == args.link_down_at and world.rank == world.world_size - 1:
            print(f"rank {world.rank}: step {step}, taking eth0 down", flush=True)
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1, device=world.device))
        except RuntimeError as error:
            print(f"rank {world.rank}: step {step} failed after "
                  f"{time.monotonic() - start:.1f} s: {error}", flush=True)
            raise
        time.sleep(0.1)
    teardown()


if __name__ == "__main__":
    main()
