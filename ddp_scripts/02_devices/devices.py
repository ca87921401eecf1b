"""Lesson 02: each rank picks its device from LOCAL_RANK, and the backend from the device.

On a machine with GPUs, local rank k uses cuda:k and the NCCL backend; without
GPUs every rank uses the CPU and Gloo. Each rank then proves its choice works: an
all_reduce on its device, and loading a tensor that its node's local rank 0 saved,
with and without map_location. Rank 0 prints a summary and, with --out, writes it
as JSON.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/02_devices/devices.py
"""

import os
import tempfile

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown


def parse_args():
    parser = arguments(__doc__)  # --device and --out, from ddp_common
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: the default backend for the chosen device")
    parser.add_argument("--workdir", default=tempfile.gettempdir(),
                        help="a folder on each node for the file saved and loaded")
    args = parser.parse_args()
    if args.device == "cpu" and args.backend == "nccl":
        parser.error("NCCL only moves CUDA tensors: use --backend gloo with --device cpu")
    return args


@record  # an exception that ends main() goes into torchrun's report (lesson 01)
def main():
    args = parse_args()
    rank, local_rank, world_size, device = setup(args.device, args.backend)
    backend = dist.get_backend()
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
    # Rank 0 writes every rank's record; a collective, so once it returns every rank
    # has loaded the file and it can go.
    report(args.out, mine, all_reduce_sum=value.item())
    if local_rank == 0:
        os.remove(path)
    if rank == 0:
        print(f"all_reduce of 1..{world_size} gave {value.item():g}")
    teardown()


if __name__ == "__main__":
    main()
