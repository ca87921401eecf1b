"""Lesson 23: torchrun itself fails when it reads an error file a rank is still writing.

Attempt 0: rank 0 raises, and @record's handler starts writing the error file on a
"slow disk" (json.dump stalls --stall seconds before it writes). Once it has started,
the last rank kills itself with SIGKILL. torchrun sees the death, stops rank 0 with
SIGTERM in the middle of its write, and reads rank 0's error file:
  --handler torch  (torch's ErrorHandler) left the file empty: torchrun fails on it;
  --handler whole  (ddp_common's WholeErrorFile) left no file: torchrun restarts the job.
In attempt 1 every rank exits at once. No process group is needed.

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        ddp_scripts/23_fault_tolerance/error_file.py --handler torch
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from ddp_common import WholeErrorFile, require_torchrun, write_json
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

HANDLERS = {"torch": ErrorHandler, "whole": WholeErrorFile}


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handler", choices=HANDLERS, default="torch")
    parser.add_argument("--stall", type=float, default=30,
                        help="seconds rank 0's write stalls (torchrun stops it long before)")
    parser.add_argument("--out", help="after the restart, rank 0 writes what it found as JSON")
    return parser.parse_args()


def slow_disk(writing, stall):
    """json.dump first creates the file `writing` (the mark), then stalls."""
    dump = json.dump

    def stalled(obj, f, **kwargs):
        writing.touch()
        time.sleep(stall)
        dump(obj, f, **kwargs)
    json.dump = stalled


def fail():
    raise RuntimeError("rank 0 fails on purpose")


def main():
    args = parse_args()
    require_torchrun()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # one mark per launch: every rank knows torchrun's run id and port
    writing = Path(tempfile.gettempdir()) / (
        f"ddp-course-08-{os.environ['TORCHELASTIC_RUN_ID']}-{os.environ['MASTER_PORT']}")
    if attempt > 0:
        print(f"rank {rank}: attempt {attempt}, nothing left to do")
        if rank == 0 and args.out:
            mine = Path(os.environ["TORCHELASTIC_ERROR_FILE"])  # <run>/attempt_N/0/error.json
            first = mine.parents[1].with_name("attempt_0") / "0"
            left = sorted(p.name for p in first.glob("error.json*"))
            write_json(args.out, {"restart": attempt, "left": left})
    elif rank == 0:
        slow_disk(writing, args.stall)
        record(fail, error_handler=HANDLERS[args.handler]())()
    elif rank == world_size - 1:
        deadline = time.monotonic() + 60
        while not writing.exists():
            if time.monotonic() > deadline:
                sys.exit("rank 0 did not start writing its error file within 60 s")
            time.sleep(0.01)
        writing.unlink()
        print(f"rank {rank}: rank 0 is writing its error file; SIGKILL to myself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(args.stall)  # until torchrun stops this rank


if __name__ == "__main__":
    main()
