"""The set-up every companion script from lesson 01 on shares (lesson 01 explains it).

    from ddp_common import record, setup, teardown

    @record              # lesson 00's @record, with the fix lesson 08 explains
    def main():
        world = setup()  # checks torchrun started us, picks the device, joins the group
        ...              # the lesson's own code: world.rank, world.device, a DDP model ...
        del ddp          # any DDP model goes first (lesson 05, "A clean exit")
        teardown()       # leaves the group

Run on its own, it checks that a launch works on this machine:

    torchrun --standalone --nproc-per-node=2 ddp_scripts/ddp_common.py
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
    """Stop with a clear message when started by plain `python` (lesson 00)."""
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
    """Lesson 00's @record, writing the error file with WholeErrorFile (lesson 08)."""
    return errors.record(main, error_handler=WholeErrorFile())


class World(NamedTuple):
    """Who this process is (from torchrun's variables) and the device it uses."""
    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def setup(device="auto", backend="auto", timeout_s=None, ddp=False):
    """Check torchrun started us, pick the device, join the default process group.
    ddp=True: for a script that builds a DDP model (lesson 05, "A clean exit")."""
    require_torchrun()
    if ddp:  # DDP's constructor imports this; imported after the group, it keeps it alive
        import torch._dynamo  # noqa: F401
    picked = pick_device(device)
    if backend == "auto":
        backend = dist.get_default_backend_for_device(picked)  # cuda: nccl, cpu: gloo
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, timeout=timeout,
                            device_id=picked if picked.type == "cuda" else None)
    return World(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                 int(os.environ["WORLD_SIZE"]), picked)


def teardown():
    """Leave the group, once no DDP model is left (lesson 05, "A clean exit")."""
    gc.collect()  # frees DDP models caught in a reference cycle
    alive = sum(issubclass(type(o), DistributedDataParallel) for o in gc.get_objects())
    if alive:
        raise RuntimeError(f"teardown: {alive} DistributedDataParallel model(s) still alive; "
                           "`del` them first (freeing a model after its process group is "
                           "gone can hang this process: lesson 05, 'A clean exit')")
    dist.destroy_process_group()


def write_results(path, model=None, **numbers):
    """Write a run's numbers as JSON to `path` (nothing if it is None): every rank's,
    gathered by rank 0, with a digest of each rank's weights and rank 0's weights. A
    plain script (no process group) writes its own; started by torchrun, rank 0's only."""
    if path is None:
        return
    mine, weights = dict(numbers), None
    if model is not None:
        weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
        mine["weights_sha256"] = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
    ranks = [mine]
    if dist.is_initialized():
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    if (dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))) != 0:
        return
    found = {"world_size": len(ranks), "ranks": ranks}
    if weights is not None:
        found["weights"] = weights.tolist()
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(found, f)
    os.replace(partial, path)  # a reader sees no file, or all of it


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    world = setup()
    ones = torch.ones(1, device=world.device)
    dist.all_reduce(ones)
    print(f"rank {world.rank} of {world.world_size} on {world.device} with "
          f"{dist.get_backend()}: the sum of {world.world_size} ones is {ones.item():g}")
    teardown()
