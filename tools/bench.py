"""`make bench`: the figures the course's budgets are about, measured on this machine.

* the cost of one 2-rank torchrun launch of a minimal script (join a process group,
  meet at a barrier, leave) against a bare `python -c "import torch"`, of one that also
  builds a DDP model (whose constructor imports torch._dynamo), and of 1 and 4 ranks, medians of
  several runs, as a learner's shell starts them (cold); then the same launches through
  the course's launcher, which on Linux forks torchrun and its workers from a process
  that has imported torch (tools/zygote.py, warm): those are the lessons' launches, and
  their floor;
* the start of a notebook kernel under papermill (a lesson of one empty cell), medians;
* the execution time of each lesson under papermill, and of the whole course, with the
  launches each lesson makes: every launch pays the start-up above for its number of
  processes (plus the DDP import when its script builds a DDP model), so those launches,
  one kernel start, and for lesson 32 the set-up and teardown of its hosts and Slurm,
  are the lesson's floor on this machine; the whole course's time over the sum of the
  floors is the overhead the course adds (budget FLOOR_BUDGET_RATIO: time that is
  neither launches, kernels nor a lesson's own work is to be removed);
* lesson 10's hand-written ring all-reduce against dist.all_reduce (4 MiB, 2 and 4 ranks).

Budgets (on 2 CPU cores): a warm 2-rank launch with a DDP model at most 0.6x the bare
import; a lesson under 20 s (lesson 32, which sets up two hosts and Slurm, and lesson
16, which sets up two hosts and slows their link, under 45 s with their set-up; the
capstone, lesson 40, under 60 s); the whole course under 4 minutes and at most 1.5x its
floor; `make test` under 20 minutes (timed by CI, not here). Lesson 32's set-up and
teardown are also timed on their own. Printed, not asserted: wall times depend on the
machine and its load. Each lesson's launches are counted warm and cold (a launch that
sets a variable read at start-up, or a Slurm job, starts cold).

The lessons' seconds are kept in tools/lesson_seconds.json for the course map, which is
then rewritten in the README and in the first lesson (`--no-record` leaves them alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import nbformat

from tools import lessons as registry
from tools.course import REPO, execute, lessons, make_workspace, uses_cluster, why_not_here
from tools.launch import LOG
from tools.lessons import LESSON_BUDGET_S

# Join, meet once, leave: a rank that leaves straight after joining can close its Gloo
# connections while a peer is still completing its own (connectFullMesh: "Connection
# closed by peer"), seen in 3 of 40 warm 4-rank launches, whose ranks join together.
MINIMAL_SCRIPT = """\
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
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
LAUNCH_BUDGET_RATIO = 0.6  # a warm 2-rank launch with a DDP model, over a bare import
# a lesson's budget: 20 s, more for the few that build hosts or train the capstone
LESSON_BUDGETS_S = {lesson.stem: lesson.budget_s for lesson in registry.LESSONS
                    if lesson.budget_s != LESSON_BUDGET_S}
COURSE_BUDGET_S = 240.0
FLOOR_BUDGET_RATIO = 1.5
RING_BUDGET_RATIO = 1.5


def timed(argv) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return time.monotonic() - start


def timed_launch(script: Path, nproc: int) -> float:
    """Seconds of a launch through the course's launcher (tools/launch.py), which on Linux
    forks a warm torchrun (tools/zygote.py) instead of starting a new one."""
    from tools.launch import launch

    return launch(script.name, nproc=nproc, cwd=script.parent, echo=False).seconds


def kernel_starts(workspace: Path, folder: Path, repeats: int) -> list[float]:
    """Seconds papermill takes to start a kernel, run one empty cell and stop, as a lesson
    would (same execute(), same workspace)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("world_size = 2", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("pass")]
    return [execute(nb, folder / f"kernel_{i}.ipynb", workspace) for i in range(repeats)]


def ring_ratios() -> dict[int, float]:
    """Ring time / dist.all_reduce time on 2^20 float32 values (4 MiB), medians of 9, from one
    4-rank launch of lesson 10's ring script (the ring on ranks 0-1, then on all 4)."""
    from tools.launch import cpu_unless_enough_gpus, launch

    data = launch("ddp_scripts/10_collectives/ring.py", "--ring-world-sizes", "2", "4",
                  "--ring-sizes", "1", "--repeats", "9", nproc=4, out=True, timeout=300,
                  echo=False, env=cpu_unless_enough_gpus(4)).data
    return {ring["world_size"]: ring["timing"]["seconds"]["ring"]
            / ring["timing"]["seconds"]["all_reduce"] for ring in data["rings"]}


# A launch's echo: `$ torchrun ...`, `$ RANK=0 ... python ...`, `nodeA$ sbatch ...`; not
# lesson 32's other commands on its hosts (`nodeA$ sinfo -N`).
LAUNCH_ECHO = re.compile(r"\w*\$ (\w+=\S* )*(torchrun|python|sbatch) ")
SCRIPT_WORD = re.compile(r"\.(py|sbatch|sh)$")
PER_NODE = re.compile(r"--nproc[-_]per[-_]node[= ](\d+)")
DDP_BUILT = re.compile(r"\bDDP\(|DistributedDataParallel\(|ddp=True")


class Launch(NamedTuple):
    """One launch a lesson made, from the commands the launchers echoed."""
    script: str  # the first word of its commands that names a file
    processes: int  # the processes it started: torchrun's per node, summed; 1 per python
    torchrun: bool  # started by torchrun (else plain python, or a Slurm job)


def launches(executed: Path) -> list[Launch]:
    """The launches an executed lesson made: `launch`, `launch_ranks` and `launch_nodes`
    echo each command as `$ ...` (lesson 32's hosts as `nodeA$ ...`), one line per process
    or node that ends in ` &` when a launch starts several; a Slurm job is echoed as
    `nodeA$ sbatch ...`."""
    found: list[list[str]] = []
    for cell in nbformat.read(executed, as_version=4).cells:
        together = False  # a cell's stream may come in several outputs
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if LAUNCH_ECHO.match(line):
                    if together:
                        found[-1].append(line)
                    else:
                        found.append([line])
                    together = line.endswith(" &")
                elif line.strip():
                    together = False
    result = []
    for lines in found:
        words = [w for line in lines for w in line.split() if SCRIPT_WORD.search(w)]
        per_node = [PER_NODE.search(line) for line in lines]
        torchrun = [" torchrun " in f" {line} " for line in lines]
        processes = sum(int(m[1]) if m else 1 for m in per_node)
        if " sbatch " in f" {lines[0]} ":
            processes = 2  # a Slurm job of the course: two tasks
        result.append(Launch(words[0] if words else "", processes, any(torchrun)))
    return result


def launched_scripts(executed: Path) -> list[str]:
    """The script of each launch an executed lesson made (see launches)."""
    return [launch.script for launch in launches(executed)]


def launches_in(executed: Path) -> int:
    """How many launches an executed lesson made (see launched_scripts)."""
    return len(launched_scripts(executed))


def builds_ddp(script: str, root: Path = REPO) -> bool:
    """Whether a launched course script (`script`, relative to `root`; or a module it imports
    from its lesson's folder or ddp_scripts/shared) builds a DDP model, whose constructor
    imports torch._dynamo: such a launch costs the minimal DDP launch, not the minimal one."""
    path = root / script
    if not path.is_file():
        return False
    text = path.read_text()
    for name in re.findall(r"^(?:from|import) (\w+)", text, re.M):
        for folder in (path.parent, root / "ddp_scripts" / "shared"):
            if (folder / f"{name}.py").is_file() and name != "ddp_common":
                text += (folder / f"{name}.py").read_text()
                break
    return bool(DDP_BUILT.search(text))


def launch_floor(made: Launch, minimal: dict, bare: float, ddp_extra: float) -> float:
    """The least a launch like `made` costs on this machine: a plain `python` start per
    process (bare import) or the minimal torchrun launch of its processes (`minimal`, by
    count, measured at 1, 2 and 4: others interpolated), plus the DDP import when its
    script builds a DDP model. Processes beyond the cores start one after another."""
    share = max(1.0, made.processes / (os.cpu_count() or 1))
    if made.torchrun or made.script.endswith(".sbatch"):  # a Slurm job: as torchrun
        known = sorted(minimal)
        low = max([n for n in known if n <= made.processes], default=known[0])
        high = min([n for n in known if n >= made.processes], default=known[-1])
        cost = minimal[low] if low == high else (
            minimal[low] + (minimal[high] - minimal[low]) * (made.processes - low) / (high - low))
        if made.processes > known[-1]:
            cost = minimal[known[-1]] * made.processes / known[-1]
    else:
        cost = bare * share
    return cost + (ddp_extra * share if builds_ddp(made.script) else 0.0)


def verdict(ok: bool) -> str:
    return "within budget" if ok else "OVER BUDGET"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-lessons", action="store_true")
    parser.add_argument("--only", action="append", metavar="STEM",
                        help="time only this lesson (repeatable): a new lesson's seconds for "
                        "the course map, without running the others")
    parser.add_argument("--no-record", action="store_true",
                        help="do not keep the lessons' seconds for the course map")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        script, ddp_script = Path(folder) / "minimal.py", Path(folder) / "minimal_ddp.py"
        script.write_text(MINIMAL_SCRIPT)
        ddp_script.write_text(MINIMAL_DDP_SCRIPT)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2"]
        imports, two_ranks, ddp_launches, warm_ddp = [], [], [], []
        by_processes: dict[int, list[float]] = {1: [], 4: []}
        warm: dict[int, list[float]] = {1: [], 2: [], 4: []}
        for i in range(args.repeats):
            imports.append(timed([sys.executable, "-c", "import torch"]))
            two_ranks.append(timed([*torchrun, str(script)]))
            ddp_launches.append(timed([*torchrun, str(ddp_script)]))
            for n, times in by_processes.items():
                times.append(timed([*torchrun[:-1], f"--nproc-per-node={n}", str(script)]))
            for n, times in warm.items():
                times.append(timed_launch(script, n))
            warm_ddp.append(timed_launch(ddp_script, 2))
            print(f"run {i + 1}/{args.repeats}: import torch {imports[-1]:.2f} s, "
                  f"2-rank launch {two_ranks[-1]:.2f} s, with a DDP model "
                  f"{ddp_launches[-1]:.2f} s; 1 rank {by_processes[1][-1]:.2f} s, 4 ranks "
                  f"{by_processes[4][-1]:.2f} s; the launcher's 2-rank launch "
                  f"{warm[2][-1]:.2f} s", flush=True)
    bare, launch = statistics.median(imports), statistics.median(two_ranks)
    ddp_launch = statistics.median(ddp_launches)
    # The lessons launch through tools/launch.py: their floor is its launches (warm on Linux)
    minimal = {n: statistics.median(times) for n, times in warm.items()}
    print(f"\nmedian bare `import torch`:  {bare:.2f} s")
    print(f"cold (torchrun from a shell): 2-rank {launch:.2f} s ({launch / bare:.1f}x the "
          f"import), with a DDP model {ddp_launch:.2f} s ({ddp_launch / bare:.1f}x; its "
          "constructor imports torch._dynamo)")
    from tools import zygote

    warm_ddp_median = statistics.median(warm_ddp)
    how = "warm, tools/zygote.py" if zygote._server is not None and zygote.why_cold is None \
        else f"cold here: {zygote.why_cold}"
    print(f"the course's launcher ({how}): 2-rank {minimal[2]:.2f} s, with a DDP model "
          f"{warm_ddp_median:.2f} s")
    ratio = warm_ddp_median / bare
    print(f"DDP launch / import:          {ratio:.2f}x  (budget {LAUNCH_BUDGET_RATIO:g}x: "
          f"{verdict(ratio <= LAUNCH_BUDGET_RATIO)})")
    ddp_launch, launch = warm_ddp_median, minimal[2]
    for n, ring_ratio in ring_ratios().items():
        print(f"ring / all_reduce, 4 MiB, {n} ranks: {ring_ratio:.2f}x  (budget "
              f"{RING_BUDGET_RATIO:g}x: {verdict(ring_ratio <= RING_BUDGET_RATIO)})")
    if args.skip_lessons:
        return 0

    with tempfile.TemporaryDirectory() as folder:
        workspace = make_workspace(Path(folder) / "course")
        kernel = statistics.median(kernel_starts(workspace, Path(folder), args.repeats))
        print(f"median kernel start:          {kernel:.2f} s  (papermill, one empty cell)")
        cluster_up_down = cluster_setup()
        print(f"median 1-rank, 4-rank launch by the course's launcher: {minimal[1]:.2f} s, "
              f"{minimal[4]:.2f} s")
        print("\nlesson                          seconds  launches (cold)  floor (each launch's "
              "minimal one for its processes, DDP or not; one kernel start"
              f"{'; the hosts and Slurm' if cluster_up_down else ''})")
        total, total_launches, total_floor = 0.0, 0, 0.0
        seconds_by_lesson = {}
        single_machine = 0.0
        for path in lessons():
            if args.only and path.stem not in args.only:
                continue
            reason = why_not_here(path)
            if reason:
                print(f"{path.name:<30}  skipped: {reason}", flush=True)
                continue
            executed = Path(folder) / "out" / path.name
            log = Path(folder) / f"{path.stem}.launches.jsonl"
            os.environ[LOG] = str(log)
            try:
                seconds = execute(nbformat.read(path, as_version=4), executed, workspace)
            finally:
                del os.environ[LOG]
            cold = sum(not json.loads(line)["warm"] for line in
                       (log.read_text().splitlines() if log.exists() else []))
            seconds_by_lesson[path.stem] = seconds
            made = launches(executed)
            count = len(made)
            floor = (sum(launch_floor(m, minimal, bare, ddp_launch - launch) for m in made)
                     + kernel + (cluster_up_down if uses_cluster(nbformat.read(path, as_version=4))
                                 else 0.0))
            total += seconds
            total_launches += count
            total_floor += floor
            single_machine += 0 if path.stem in LESSON_BUDGETS_S else seconds
            budget = LESSON_BUDGETS_S.get(path.stem, LESSON_BUDGET_S)
            print(f"{path.name:<30}  {seconds:7.1f}  {count:8d} ({cold:2d})  {floor:5.0f} s   "
                  f"{verdict(seconds < budget)}" + (f" ({budget:g} s)" if budget !=
                                                    LESSON_BUDGET_S else ""), flush=True)
    print(f"{'these lessons' if args.only else 'whole course':<30}  {total:7.1f}  "
          f"{total_launches:8d}       "
          f"{total_floor:5.0f} s   {verdict(total < COURSE_BUDGET_S)}")
    over = total / total_floor if total_floor else float("nan")
    print(f"{'... over its floor':<30}  {over:6.2f}x  (budget {FLOOR_BUDGET_RATIO:g}x: "
          f"{verdict(over <= FLOOR_BUDGET_RATIO)})")
    print(f"{'... without lesson 32':<30}  {single_machine:7.1f}  {'':8}  {'':7}   "
          f"{verdict(single_machine < COURSE_BUDGET_S)}")
    if not args.no_record:
        from tools import course_map

        kept = {**course_map.recorded_seconds(), **seconds_by_lesson}
        how = f"make bench, {time.strftime('%Y-%m-%d')}, {len(seconds_by_lesson)} lessons timed"
        if args.only and course_map.SECONDS_FILE.exists():  # the others keep their run's
            before = json.loads(course_map.SECONDS_FILE.read_text()).get("_how", "")
            how = f"{before}; {', '.join(args.only)}: {how} (--only)"
        course_map.record_seconds(kept, how)
        course_map.write()
        print(f"\nkept the seconds of {len(seconds_by_lesson)} lessons in "
              f"{course_map.SECONDS_FILE.name}; rewrote the course map")
    return 0


def cluster_setup() -> float:
    """Lesson 32's cluster on its own: packages, up (hosts and Slurm), down. Returns the
    seconds of up and down (part of lesson 32's floor), 0 where it cannot run."""
    from tools import cluster

    reason = cluster.why_not()
    if reason:
        print(f"\nlesson 12's cluster: not timed ({reason})")
        return 0.0
    missing = cluster.missing_packages()
    up = cluster.up()
    start = time.monotonic()
    cluster.down(quiet=True)
    down = time.monotonic() - start
    print(f"lesson 32's cluster: up in {up:.1f} s "
          f"({'installing ' + ' '.join(missing) if missing else 'packages already installed'}), "
          f"down in {down:.1f} s, leftovers: {cluster.leftovers() or 'none'}")
    return up + down


if __name__ == "__main__":
    sys.exit(main())
