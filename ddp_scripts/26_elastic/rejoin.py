"""Lesson 26: a host that comes back. Waits until the job's log (--log) shows a world of
--world ranks that has trained --steps steps, then runs torchrun with the arguments after
`--`, here, as the host's operator (or a scheduler) starts it again.

    python ddp_scripts/26_elastic/rejoin.py --log /tmp/job1/steps.jsonl --world 2 --steps 4 \\
        -- --nnodes=1:2 --nproc-per-node=2 ... ddp_scripts/26_elastic/elastic_train.py ...
"""

import argparse
import json
import sys
import time
from pathlib import Path


def trained(log, world):
    """Steps the log shows trained by a world of `world` ranks since it last started."""
    count = 0
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        if entry.get("event") == "start":
            count = 0
        elif entry["world"] == world:
            count += 1
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait at most")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait
    while trained(args.log, args.world) < args.steps:
        if time.monotonic() > deadline:
            sys.exit(f"rejoin: no world of {args.world} trained {args.steps} steps in "
                     f"{args.wait:g} s ({args.log})")
        time.sleep(0.05)
    print(f"rejoin: a world of {args.world} trained {args.steps} steps: starting torchrun",
          flush=True)
    from torch.distributed.run import main as torchrun

    sys.argv = ["torchrun", *[a for a in args.torchrun if a != "--"]]
    torchrun()


if __name__ == "__main__":
    main()
