"""Lesson 01: each rank picks its device from LOCAL_RANK, and the backend from the device.

On a machine with GPUs, local rank k uses cuda:k and the NCCL backend; without
GPUs every rank uses the CPU and Gloo. Each rank then proves its choice works: an
all_reduce on its device, and loading a tensor that its node's local rank 0 saved,
with and without map_location. Rank 0 prints a summary and, with --out, writes it
as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/01_devices.py
"""

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: cuda:LOCAL_RANK when GPUs are visible, else the CPU")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: the default backend for the chosen device")
    parser.add_argument("--workdir", default=tempfile.gettempdir(),
                        help="a folder on each node for the file saved and loaded")
    parser.add_argument("--out", help="rank 0 writes its findings as JSON to this path")
    args = parser.parse_args()
    if args.device == "cpu" and args.backend == "nccl":
        parser.error("NCCL only moves CUDA tensors: use --backend gloo with --device cpu")
    return args


def require_torchrun():
    """Stop with a clear message when started by plain `python`."""
    missing = [name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
               if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: {', '.join(missing)} not set. This script is one rank "
                 f"of a distributed job: start it with torchrun, for example\n"
                 f"  torchrun --standalone --nproc-per-node=2 {sys.argv[0]}")


def pick_device(local_rank, local_world_size, choice):
    """cuda:LOCAL_RANK when GPUs are wanted and visible, otherwise the CPU."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if visible == 0:
        sys.exit("--device cuda, but no GPU is visible: use --device cpu (or auto)")
    if local_world_size > visible:
        # Every rank checks this before joining the group, so all of them stop.
        sys.exit(f"{local_world_size} process(es) on this node but {visible} visible GPU(s) "
                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                 f"Use --nproc-per-node={visible}, or --device cpu.")
    return torch.device("cuda", local_rank)


@record  # an exception that ends main() goes into torchrun's report (lesson 00)
def main():
    args = parse_args()
    require_torchrun()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    is_rank0 = rank == 0

    device = pick_device(local_rank, local_world_size, args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the object collectives use this device
    backend = dist.get_default_backend_for_device(device) if args.backend == "auto" \
        else args.backend
    # device_id binds this process's NCCL communicator to its own GPU from the start.
    dist.init_process_group(backend=backend,
                            device_id=device if device.type == "cuda" else None)
    print(f"rank {rank} (local rank {local_rank}) uses {device} with {backend}")

    # 1. A collective on the chosen device: the sum of 1..world_size.
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)

    # 2. Local rank 0 of each node saves a tensor from its device into a folder of
    #    that node; after the barrier every rank on the node loads it twice.
    path = os.path.join(args.workdir, f"ddp-course-01-{os.environ['MASTER_PORT']}-"
                                      f"node{os.environ['GROUP_RANK']}.pt")
    if local_rank == 0:
        torch.save(torch.arange(3.0, device=device), path)
    dist.barrier()  # nobody loads before the file is complete
    as_saved = torch.load(path, weights_only=True)  # lands where it was saved
    mapped = torch.load(path, map_location=device, weights_only=True)  # lands on our device

    compiled = torch.accelerator.current_accelerator()  # what this build was made for
    usable = torch.accelerator.current_accelerator(check_available=True)  # and can use now
    mine = {
        "rank": rank, "local_rank": local_rank, "device": str(device), "backend": backend,
        "cuda_available": torch.cuda.is_available(),
        "cuda_device_count": torch.cuda.device_count(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "accelerator": compiled.type if compiled else None,
        "accelerator_available": usable.type if usable else None,
        "all_reduce_device": str(value.device),
        "loaded_without_map_location": str(as_saved.device),
        "loaded_with_map_location": str(mapped.device),
    }
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    dist.barrier()  # every rank has loaded the file before it is removed
    if local_rank == 0:
        os.remove(path)
    if is_rank0:
        print(f"all_reduce of 1..{world_size} gave {value.item():g}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": world_size, "all_reduce_sum": value.item(),
                           "ranks": everyone}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
