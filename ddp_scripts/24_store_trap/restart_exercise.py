"""Exercise (lesson 24): join the process group so that a torchrun restart works, even
when a rank comes back late. The job around it is restart_harness.py.
    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        ddp_scripts/24_store_trap/restart_exercise.py
"""

import torch.distributed as dist
from restart_harness import agent_store, run_exercise


def init_for_restarts(rank, world_size, restart, timeout):
    """Join the default group with Gloo; `restart` is TORCHELASTIC_RESTART_COUNT."""
    # STUB: dist.init_process_group("gloo", timeout=timeout)
    ### BEGIN SOLUTION
    store = dist.PrefixStore(f"restart-{restart}", agent_store())
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(init_for_restarts)
