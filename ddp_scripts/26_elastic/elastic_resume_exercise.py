"""Exercise (lesson 26): resume a job in a world of any size from the newest complete
checkpoint in its folder. Write resume(); the new world it serves is elastic_resume_harness.py.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/26_elastic/elastic_resume_exercise.py \\
        --dir /tmp/ddp-course-elastic/exercise --to 156
"""

import torch.distributed.checkpoint as dcp
from elastic_resume_harness import run_exercise
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def resume(folder, model, optimizer):
    """Every rank of a new world calls it with a freshly built DDP model and its SGD
    optimizer. Load the newest complete checkpoint in `folder` (step-N folders written by
    elastic_train.py's save, in a world of any size, and no `latest` file) and return
    its step; with none there, return 0 and change nothing."""
    # STUB: return 0  # replace with your answer
    ### BEGIN SOLUTION
    complete = [p for p in folder.glob("step-*") if (p / ".metadata").exists()]
    if not complete:
        return 0
    newest = max(complete, key=lambda p: int(p.name.removeprefix("step-")))  # 102 > 99
    model_state, optim_state = get_state_dict(model, optimizer)  # by name: any world
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=newest)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    return int(newest.name.removeprefix("step-"))
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(resume)
