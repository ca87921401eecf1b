"""The set-up every companion script from lesson 02 on shares (lesson 02 explains it).

    from ddp_common import arguments, record, report, setup, teardown

    @record  # lesson 01's @record, with the fix lesson 23 explains
    def main():
        args = arguments(__doc__).parse_args()  # --device, --out (add your own first)
        world = setup(args.device)  # checks torchrun started us, picks the device, joins
        ...                         # the lesson's own code: world.rank, a DDP model ...
        report(args.out, {"loss": loss})  # every rank's results, as JSON from rank 0
        del ddp                     # any DDP model goes first (lesson 13, "A clean exit")
        teardown()                  # leaves the group

Run on its own, it checks that a launch works on this machine:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/shared/ddp_common.py
"""

import argparse
import datetime
import gc
import hashlib
import json
import os
import sys
import time
import traceback
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import errors
from torch.nn.parallel import DistributedDataParallel

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT")


def require_torchrun():
    """Stop with a clear message when started by plain `python` (lesson 01)."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: {', '.join(missing)} not set. This script is one rank "
                 f"of a distributed job: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")


def pick_device(choice="auto"):
    """cuda:LOCAL_RANK when GPUs are wanted (auto: visible), made the current GPU;
    otherwise the CPU."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible == 0:
        sys.exit("--device cuda, but no GPU is visible: use --device cpu (or auto)")
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    if local_world_size > visible:
        # Every rank checks this before joining the group, so all of them stop.
        sys.exit(f"{local_world_size} process(es) on this node but {visible} visible GPU(s) "
                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                 f"Use --nproc-per-node={visible}, or --device cpu.")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)  # NCCL and the object collectives use the current GPU
    return device


class WholeErrorFile(errors.ErrorHandler):
    """torch's error handler, but the error file appears complete or not at all."""

    def record_exception(self, e):
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")  # set by torchrun, one per rank
        if not path:
            return
        report = {"message": {"message": f"{type(e).__name__}: {e}",  # what torchrun reads
                              "extraInfo": {"py_callstack": traceback.format_exc(),
                                            "timestamp": str(int(time.time()))}}}
        partial = f"{path}.partial"
        with open(partial, "w") as f:
            json.dump(report, f)
        os.replace(partial, path)  # one step: torchrun sees no file, or all of it


def record(main):
    """Lesson 01's @record, writing the error file with WholeErrorFile (lesson 23)."""
    return errors.record(main, error_handler=WholeErrorFile())


class World(NamedTuple):
    """Who this process is (from torchrun's variables) and the device it uses."""
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def setup(device="auto", backend="auto", timeout_s=None, ddp=False, restarts=False):
    """Check torchrun started us, pick the device, join the default process group.
    ddp=True: for a script that builds a DDP model (lesson 13, "A clean exit").
    restarts=True: for a job torchrun may restart (lesson 24's store trap)."""
    require_torchrun()
    if ddp:  # DDP's constructor imports this; imported after the group, it keeps it alive
        import torch._dynamo  # noqa: F401
    picked = pick_device(device)
    if backend == "auto":
        backend = dist.get_default_backend_for_device(picked)  # cuda: nccl, cpu: gloo
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    joining = {}
    if restarts and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=datetime.timedelta(seconds=60))
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]  # keys of this attempt only
        joining = {"store": dist.PrefixStore(f"restart-{attempt}", agent),
                   "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    dist.init_process_group(backend, timeout=timeout,
                            device_id=picked if picked.type == "cuda" else None, **joining)
    return World(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                 int(os.environ["WORLD_SIZE"]), picked)


def teardown():
    """Leave the group, once no DDP model is left (lesson 13, "A clean exit")."""
    gc.collect()  # frees DDP models caught in a reference cycle
    alive = sum(issubclass(type(o), DistributedDataParallel) for o in gc.get_objects())
    if alive:
        raise RuntimeError(f"teardown: {alive} DistributedDataParallel model(s) still alive; "
                           "`del` them first (freeing a model after its process group is "
                           "gone can hang this process: lesson 13, 'A clean exit')")
    dist.destroy_process_group()


def arguments(doc, device=True):
    """The options every course script takes, --device (not for a CPU-only script:
    device=False) and --out; a script adds its own to the parser this returns, then
    calls parse_args()."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if device:
        parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                            help="auto: cuda:LOCAL_RANK when GPUs are visible, else the CPU")
    parser.add_argument("--out", help="rank 0 writes what every rank found here, as JSON")
    return parser


def write_json(path, data):
    """Write `data` as JSON in one step: a reader sees no file, or all of it."""
    partial = f"{path}.{os.getpid()}.partial"  # this process's own
    with open(partial, "w") as f:
        json.dump(data, f)
    os.replace(partial, path)


def report(path, mine, **shared):
    """Every rank's `mine` (a dict of JSON values), gathered: rank 0 writes
    {"world_size": N, "ranks": [rank 0's, rank 1's, ...], **shared} to `path` (not when
    it is None). A collective: every rank calls it. Returns the list on every rank."""
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if path is not None and dist.get_rank() == 0:
        write_json(path, {"world_size": len(ranks), "ranks": ranks, **shared})
    return ranks


def write_results(path, model=None, **numbers):
    """`report` for a training run: each rank's numbers with a digest of its weights, and
    rank 0's weights. Also works in a plain script (no process group): it writes its own."""
    if path is None:
        return
    mine, shared = dict(numbers), {}
    if model is not None:
        weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
        mine["weights_sha256"] = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
        shared["weights"] = weights.tolist()
    if dist.is_initialized():
        report(path, mine, **shared)
    elif int(os.environ.get("RANK", 0)) == 0:  # a plain script (under torchrun: rank 0's)
        write_json(path, {"world_size": 1, "ranks": [mine], **shared})


if __name__ == "__main__":
    args = arguments(__doc__).parse_args()
    world = setup(args.device)
    ones = torch.ones(1, device=world.device)
    dist.all_reduce(ones)
    print(f"rank {world.rank} of {world.world_size} on {world.device} with "
          f"{dist.get_backend()}: the sum of {world.world_size} ones is {ones.item():g}")
    report(args.out, {"rank": world.rank, "device": str(world.device),
                      "sum_of_ones": ones.item()})
    teardown()
