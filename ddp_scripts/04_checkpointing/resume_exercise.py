"""Exercise (lesson 04): checkpoint a DDP run, then resume it exactly. Write
save_checkpoint and load_checkpoint; the run they serve, and its checks, are in
resume_harness.py (CPU and Gloo on any machine: the exercise is about the files).
    torchrun --standalone --nproc-per-node=2 ddp_scripts/04_checkpointing/resume_exercise.py
"""

import os

import torch
import torch.distributed as dist
from resume_harness import run_exercise


def save_checkpoint(path, model, optimizer, scheduler, step):
    """Every rank calls it after `step` optimizer steps. When it returns, on every rank,
    `path` holds everything needed to go on, complete."""
    # STUB: pass  # replace with your answer
    ### BEGIN SOLUTION
    if dist.get_rank() == 0:  # every rank holds the same state: one writer is enough
        checkpoint = {"model": model.module.state_dict(),  # no "module." prefix
                      "optimizer": optimizer.state_dict(),  # momentum buffers and lr
                      "scheduler": scheduler.state_dict(), "step": step}
        partial = path.with_name(path.name + ".tmp")
        torch.save(checkpoint, partial)
        os.replace(partial, path)  # atomic: the file is whole or absent
    dist.barrier()  # nobody goes on before the file is complete
    ### END SOLUTION


def load_checkpoint(path, model, optimizer, scheduler):
    """Every rank calls it on freshly built objects; returns the step to go on from."""
    # STUB: return 0  # replace with your answer
    ### BEGIN SOLUTION
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    return checkpoint["step"]
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(save_checkpoint, load_checkpoint)
