"""One rank of the GPU check (tools/gpu_check.py): runs a lesson's script as `python SCRIPT
ARGS` would, then writes what the rank used: its backend and the CUDA memory it took.

    torchrun --standalone --nproc-per-node=2 -m tools.gpu_rank SCRIPT ARGS...

With more ranks on this node than visible GPUs (the check's 2 ranks on one GPU), the ranks
share the GPUs: `ddp_common.pick_device` gives local rank k the GPU k mod GPUs (and a plain
script, which reads LOCAL_RANK itself, sees k mod GPUs there), and a group
asked for NCCL (or for the default backend of a CUDA device) gets Gloo, which moves CUDA
tensors through the host; NCCL refuses two ranks on one GPU. Nothing of this changes the
script: it is the course's own file, run unchanged.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
from pathlib import Path

REPORT = "DDP_COURSE_GPU_REPORT"  # a folder: each rank writes rank<RANK>.json into it
used = {"backend": None, "shared": False}


def share_gpus() -> bool:
    """Make ranks share the visible GPUs, if there are fewer GPUs than local ranks."""
    import torch
    import torch.distributed as dist

    visible = torch.cuda.device_count()
    if not visible or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= visible:
        return False
    import ddp_common

    def shared_device(choice="auto"):
        if choice == "cpu":
            return torch.device("cpu")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % visible)
        torch.cuda.set_device(device)
        return device

    def no_nccl(device):
        return "gloo" if torch.device(device).type == "cuda" else default_backend(device)

    default_backend = dist.get_default_backend_for_device
    ddp_common.pick_device = shared_device
    dist.get_default_backend_for_device = no_nccl
    # A plain script (lessons 00 and 06) takes cuda:LOCAL_RANK itself: give it the GPU
    # number that pick_device gives. The group is joined by RANK, not LOCAL_RANK.
    os.environ["LOCAL_RANK"] = str(int(os.environ["LOCAL_RANK"]) % visible)
    return True


def watch_backend() -> None:
    """Record the backend each group is made with (swapping NCCL for Gloo when shared)."""
    import torch.distributed as dist

    init = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if used["shared"] and (backend is None or "nccl" in str(backend)):
            backend = "gloo"
        init(backend, *args, **kwargs)
        used["backend"] = dist.get_backend()

    dist.init_process_group = init_process_group


def write_report() -> None:
    folder = os.environ.get(REPORT)
    if not folder:
        return
    torch = sys.modules.get("torch")
    cuda_bytes = 0
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda_bytes = sum(torch.cuda.max_memory_allocated(d)
                         for d in range(torch.cuda.device_count()))
    rank = os.environ.get("RANK", "0")
    Path(folder, f"rank{rank}.json").write_text(json.dumps(
        {"rank": int(rank), "backend": used["backend"], "shared": used["shared"],
         "cuda_bytes": int(cuda_bytes)}))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: torchrun ... -m tools.gpu_rank SCRIPT [ARGS...]")
    script = Path(sys.argv[1])
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.resolve().parent)  # as `python SCRIPT` sets it
    atexit.register(write_report)
    used["shared"] = share_gpus()
    watch_backend()
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
