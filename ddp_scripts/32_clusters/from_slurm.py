"""Lesson 32: the training of clusters.py in tasks that Slurm's srun starts without
torchrun. srun gives each task SLURM_PROCID, SLURM_NTASKS ... and none of the variables
torch reads (RANK, WORLD_SIZE ...): this maps them, then trains.

    srun python ddp_scripts/32_clusters/from_slurm.py   # in a batch script: see srun_python.sbatch
"""

import os
import sys


def from_slurm():
    """torch's variables from Slurm's. The batch script sets MASTER_ADDR and MASTER_PORT."""
    if "SLURM_PROCID" not in os.environ:
        sys.exit(f"{sys.argv[0]}: SLURM_PROCID not set. This script is one task of a Slurm job "
                 "step: start it with srun (see ddp_scripts/32_clusters/srun_python.sbatch), "
                 "or start ddp_scripts/32_clusters/clusters.py with torchrun")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        sys.exit(f"{sys.argv[0]}: started by srun, but {' and '.join(missing)} not set: the "
                 "batch script must export them (see ddp_scripts/32_clusters/srun_python.sbatch)")
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
    # SLURM_TASKS_PER_NODE is always there, for example "2(x2)": 2 tasks on each of 2 nodes
    os.environ["LOCAL_WORLD_SIZE"] = os.environ.get("SLURM_NTASKS_PER_NODE") or \
        os.environ["SLURM_TASKS_PER_NODE"].split("(")[0].split(",")[0]
    os.environ["GROUP_RANK"] = os.environ["SLURM_NODEID"]


if __name__ == "__main__":
    import clusters  # section 1's script, beside this one

    clusters.main(set_variables=from_slurm)
