"""`make bench`: the figures the course's budgets are about, measured on this machine.

* the cost of one 2-rank torchrun launch of a minimal script (init and destroy a
  process group) against a bare `python -c "import torch"`, and of one that also builds a
  DDP model (whose constructor imports torch._dynamo), medians of several runs;
* the start of a notebook kernel under papermill (a lesson of one empty cell), medians;
* the execution time of each lesson under papermill, and of the whole course, with the
  number of launches each lesson makes: every launch pays the start-up above, so that
  number times the minimal launch, plus one kernel start, is the lesson's floor on this
  machine; the whole course's time over the sum of the floors is the overhead the course
  adds (budget FLOOR_BUDGET_RATIO: time that is neither launches, kernels nor a lesson's
  own work is to be removed);
* lesson 02's hand-written ring all-reduce against dist.all_reduce (4 MiB, 2 and 4 ranks).

Budgets (on 2 CPU cores): a launch at most 3x the bare import; a lesson under 40 s
(the quick start, lesson 00 in ten minutes, under 30 s; lesson 12, which sets up two
hosts and Slurm, under 75 s with its set-up); the whole course under 9 minutes and at
most 1.5x its floor; `make test` under 35 minutes (timed by CI, not here). Lesson
12's set-up and teardown are also timed on their own. Printed, not asserted: wall times
depend on the machine and its load.

The lessons' seconds are kept in tools/lesson_seconds.json for the course map, which is
then rewritten in the README and in the first lesson (`--no-record` leaves them alone).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from tools.course import execute, lessons, make_workspace, why_not_here

MINIMAL_SCRIPT = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.destroy_process_group()
"""
MINIMAL_DDP_SCRIPT = """\
import torch
import torch._dynamo  # noqa: F401  before the group, as every DDP script of the course
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(2, 2))
del model
dist.destroy_process_group()
"""
LAUNCH_BUDGET_RATIO = 3.0
LESSON_BUDGET_S = 40.0
LESSON_BUDGETS_S = {"12_clusters": 75.0,  # lesson 12 builds two hosts and Slurm
                    "00_ddp_in_ten_minutes": 30.0}  # the quick start
COURSE_BUDGET_S = 540.0
FLOOR_BUDGET_RATIO = 1.5
RING_BUDGET_RATIO = 1.5


def timed(argv) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return time.monotonic() - start


def kernel_starts(workspace: Path, folder: Path, repeats: int) -> list[float]:
    """Seconds papermill takes to start a kernel, run one empty cell and stop, as a lesson
    would (same execute(), same workspace)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("world_size = 2", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("pass")]
    return [execute(nb, folder / f"kernel_{i}.ipynb", workspace) for i in range(repeats)]


def ring_ratios() -> dict[int, float]:
    """Ring time / dist.all_reduce time on 2^20 float32 values (4 MiB), medians of 9, from one
    4-rank launch of lesson 02's script (the ring on ranks 0-1, then on all 4)."""
    from tools.launch import cpu_unless_enough_gpus, launch

    data = launch("ddp_scripts/02_collectives.py", "--ring-world-sizes", "2", "4",
                  "--ring-sizes", "1", "--repeats", "9", nproc=4, out=True, timeout=300,
                  echo=False, env=cpu_unless_enough_gpus(4)).data
    return {ring["world_size"]: ring["timing"]["seconds"]["ring"]
            / ring["timing"]["seconds"]["all_reduce"] for ring in data["rings"]}


# A launch's echo: `$ torchrun ...`, `$ RANK=0 ... python ...`, `nodeA$ sbatch ...`; not
# lesson 12's other commands on its hosts (`nodeA$ sinfo -N`).
LAUNCH_ECHO = re.compile(r"\w*\$ (\w+=\S* )*(torchrun|python|sbatch) ")


def launches_in(executed: Path) -> int:
    """How many launches an executed lesson made: `launch`, `launch_ranks` and
    `launch_nodes` echo each command as `$ ...` (lesson 12's hosts as `nodeA$ ...`), one
    line per process that ends in ` &` when a launch starts several; a Slurm job is
    echoed as `nodeA$ sbatch ...`."""
    count = 0
    for cell in nbformat.read(executed, as_version=4).cells:
        together = False  # a cell's stream may come in several outputs
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if LAUNCH_ECHO.match(line):
                    count += not together
                    together = line.endswith(" &")
                elif line.strip():
                    together = False
    return count


def verdict(ok: bool) -> str:
    return "within budget" if ok else "OVER BUDGET"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-lessons", action="store_true")
    parser.add_argument("--no-record", action="store_true",
                        help="do not keep the lessons' seconds for the course map")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        script, ddp_script = Path(folder) / "minimal.py", Path(folder) / "minimal_ddp.py"
        script.write_text(MINIMAL_SCRIPT)
        ddp_script.write_text(MINIMAL_DDP_SCRIPT)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2"]
        imports, launches, ddp_launches = [], [], []
        for i in range(args.repeats):
            imports.append(timed([sys.executable, "-c", "import torch"]))
            launches.append(timed([*torchrun, str(script)]))
            ddp_launches.append(timed([*torchrun, str(ddp_script)]))
            print(f"run {i + 1}/{args.repeats}: import torch {imports[-1]:.2f} s, "
                  f"2-rank launch {launches[-1]:.2f} s, with a DDP model "
                  f"{ddp_launches[-1]:.2f} s", flush=True)
    bare, launch = statistics.median(imports), statistics.median(launches)
    ddp_launch = statistics.median(ddp_launches)
    ratio = launch / bare
    print(f"\nmedian bare `import torch`:  {bare:.2f} s")
    print(f"median 2-rank torchrun:       {launch:.2f} s")
    print(f"... with a DDP model:         {ddp_launch:.2f} s  (its constructor imports "
          "torch._dynamo)")
    print(f"launch / import:              {ratio:.1f}x  (budget {LAUNCH_BUDGET_RATIO:g}x: "
          f"{verdict(ratio <= LAUNCH_BUDGET_RATIO)})")
    for n, ring_ratio in ring_ratios().items():
        print(f"ring / all_reduce, 4 MiB, {n} ranks: {ring_ratio:.2f}x  (budget "
              f"{RING_BUDGET_RATIO:g}x: {verdict(ring_ratio <= RING_BUDGET_RATIO)})")
    if args.skip_lessons:
        return 0

    with tempfile.TemporaryDirectory() as folder:
        workspace = make_workspace(Path(folder) / "course")
        kernel = statistics.median(kernel_starts(workspace, Path(folder), args.repeats))
        print(f"median kernel start:          {kernel:.2f} s  (papermill, one empty cell)")
        print(f"\nlesson                          seconds  launches  floor (launches x "
              f"{launch:.1f} s + {kernel:.1f} s)")
        total, total_launches, total_floor = 0.0, 0, 0.0
        seconds_by_lesson = {}
        single_machine = 0.0
        for path in lessons():
            reason = why_not_here(path)
            if reason:
                print(f"{path.name:<30}  skipped: {reason}", flush=True)
                continue
            executed = Path(folder) / "out" / path.name
            seconds = execute(nbformat.read(path, as_version=4), executed, workspace)
            seconds_by_lesson[path.stem] = seconds
            count = launches_in(executed)
            floor = count * launch + kernel
            total += seconds
            total_launches += count
            total_floor += floor
            single_machine += 0 if path.stem in LESSON_BUDGETS_S else seconds
            budget = LESSON_BUDGETS_S.get(path.stem, LESSON_BUDGET_S)
            print(f"{path.name:<30}  {seconds:7.1f}  {count:8d}  {floor:5.0f} s   "
                  f"{verdict(seconds < budget)}" + (f" ({budget:g} s)" if budget !=
                                                    LESSON_BUDGET_S else ""), flush=True)
    print(f"{'whole course':<30}  {total:7.1f}  {total_launches:8d}  "
          f"{total_floor:5.0f} s   {verdict(total < COURSE_BUDGET_S)}")
    over = total / total_floor if total_floor else float("nan")
    print(f"{'... over its floor':<30}  {over:6.2f}x  (budget {FLOOR_BUDGET_RATIO:g}x: "
          f"{verdict(over <= FLOOR_BUDGET_RATIO)})")
    print(f"{'... without lesson 12':<30}  {single_machine:7.1f}  {'':8}  {'':7}   "
          f"{verdict(single_machine < COURSE_BUDGET_S)}")
    cluster_setup()
    if not args.no_record:
        from tools import course_map

        kept = {**course_map.recorded_seconds(), **seconds_by_lesson}
        course_map.record_seconds(kept, f"make bench, {time.strftime('%Y-%m-%d')}, "
                                        f"{len(seconds_by_lesson)} lessons timed")
        course_map.write()
        print(f"\nkept the seconds of {len(seconds_by_lesson)} lessons in "
              f"{course_map.SECONDS_FILE.name}; rewrote the course map")
    return 0


def cluster_setup() -> None:
    """Lesson 12's cluster on its own: packages, up (hosts and Slurm), down."""
    from tools import cluster

    reason = cluster.why_not()
    if reason:
        print(f"\nlesson 12's cluster: not timed ({reason})")
        return
    missing = cluster.missing_packages()
    up = cluster.up()
    start = time.monotonic()
    cluster.down(quiet=True)
    down = time.monotonic() - start
    print(f"\nlesson 12's cluster: up in {up:.1f} s "
          f"({'installing ' + ' '.join(missing) if missing else 'packages already installed'}), "
          f"down in {down:.1f} s, leftovers: {cluster.leftovers() or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
