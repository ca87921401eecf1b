"""The course on a GPU: every lesson's scripts, launched as its lesson launches them, on CUDA.

    make gpu-check                     # python -m tools.gpu_check
    python -m tools.gpu_check --only 03_,13_ --jobs 4
    python -m tools.gpu_check --record build/launches.jsonl   # refresh the launch list

What runs: tools/gpu_launches.json, for each script a lesson launches with torchrun on one
node, the first such launch that ended well in a CPU run of the course (made from the launch
log that `DDP_COURSE_LAUNCH_LOG=FILE make course` writes, by `--record FILE`). Each is run
twice on the GPU:
  * at world size 1 with NCCL, the script's default on CUDA (`--nproc-per-node=1`);
  * at the lesson's world size, the ranks sharing the GPU with Gloo on CUDA tensors (NCCL
    refuses two ranks on one GPU), through tools/gpu_rank.py, which runs the script unchanged.
Each rank reports the backend it used and the CUDA memory it took. A launch passes when it
exits 0 and every rank took CUDA memory; one that the lesson runs with `--device cpu`
passes on the CPU. The lesson's own world size decides the exit status; world size 1 is
reported only (some scripts need 2 ranks, and say so).

Writes build/gpu-check/report.json and report.md (GPU, torch, CUDA, date, each launch);
copy report.md's table into the README's *The course on a GPU*. `--device cpu` runs the
same machinery with the GPUs hidden (the tests use it). Every launch has a timeout and its
whole process group is killed on expiry.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.course import REPO, companion_scripts
from tools.launch import kill_tree

LAUNCHES = Path(__file__).resolve().parent / "gpu_launches.json"
OUT = REPO / "build" / "gpu-check"
TORCHRUN = re.compile(r"^torchrun --standalone --nproc-per-node=(\d+) (?:--max-restarts=(\d+) )?"
                      r"--tee 3 (ddp_scripts/\S+\.py)(.*)$")


@dataclass
class Launch:
    lesson: str
    script: str  # relative to the course root
    args: list[str]
    nproc: int
    max_restarts: int = 0  # torchrun's --max-restarts, as the lesson gives it


@dataclass
class Outcome:
    lesson: str
    script: str
    args: list[str]
    nproc: int
    backend: str  # nccl at world size 1; gloo (sharing the GPU) above it
    status: str = ""  # "cuda", "cpu (asked for)", "cpu", "failed", "timed out"
    passed: bool = False
    seconds: float = 0.0
    ranks: list[dict] = field(default_factory=list)
    tail: str = ""
    deciding: bool = False  # at the lesson's own world size: its result decides


def launches_from_log(lines: list[str]) -> list[Launch]:
    """Each script's first single-node torchrun launch that exited 0, from a launch log
    (one JSON object a line: tools/launch.py's `record`), with temporary paths kept as
    `{tmp}/...` (the check gives each run its own folder)."""
    found: dict[str, Launch] = {}
    for line in lines:
        entry = json.loads(line)
        m = TORCHRUN.match(entry["command"])
        if not m or entry["returncode"] != 0 or entry["timed_out"]:
            continue
        nproc, restarts, script, rest = int(m.group(1)), int(m.group(2) or 0), m.group(3), \
            m.group(4)
        args = [re.sub(r"^/tmp/[^/]+", "{tmp}", a) for a in shlex.split(rest)]
        lesson = Path(script).parent.name
        found.setdefault(script, Launch(lesson, script, args, nproc, restarts))
    return list(found.values())  # in the course's order: a later one may need an earlier


def not_launched(launches: list[Launch], root: Path = REPO) -> list[str]:
    """Companion scripts that no launch in the list runs."""
    listed = {launch.script for launch in launches}
    return [str(p.relative_to(root)) for p in companion_scripts(root / "ddp_scripts")
            if str(p.relative_to(root)) not in listed]


def read_launches(path: Path = LAUNCHES) -> list[Launch]:
    return [Launch(**entry) for entry in json.loads(path.read_text())["launches"]]


def judge(outcome: Outcome, returncode: int | None, reports: list[dict]) -> None:
    """Fill in a run's status and whether it passed, from how it ended and what its ranks
    reported."""
    asked_cpu = "--device" in outcome.args and \
        outcome.args[outcome.args.index("--device") + 1] == "cpu"
    if returncode is None:
        outcome.status = "timed out"
    elif returncode != 0:
        outcome.status = "failed"
    elif len(reports) == outcome.nproc and all(r["cuda_bytes"] > 0 for r in reports):
        outcome.status = "cuda"
    else:
        outcome.status = "cpu (asked for)" if asked_cpu else "cpu"
    outcome.passed = outcome.status in ("cuda", "cpu (asked for)")


def run(launch: Launch, nproc: int, timeout: float, hide_gpus: bool,
        tmp: str | None = None) -> Outcome:
    """One launch of a script under tools/gpu_rank.py, its temporary paths in `tmp` (a new
    folder if None), killed with its process group at the timeout."""
    if tmp is None:
        with tempfile.TemporaryDirectory(prefix="ddp-gpu-check-") as folder:
            return run(launch, nproc, timeout, hide_gpus, folder)
    outcome = Outcome(launch.lesson, launch.script, launch.args, nproc,
                      "nccl" if nproc == 1 else "gloo")
    args = [a.replace("{tmp}", tmp) for a in launch.args]
    for a in args:  # a path the lesson's run wrote into: its folder exists
        if a.startswith(tmp):
            Path(a).parent.mkdir(parents=True, exist_ok=True)
    reports = Path(tempfile.mkdtemp(prefix="reports-", dir=tmp))
    env = {**os.environ, "DDP_COURSE_GPU_REPORT": str(reports), "PYTHONUNBUFFERED": "1"}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", f"--max-restarts={launch.max_restarts}", "-m",
            "tools.gpu_rank", launch.script, *args]
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc)  # torchrun and its workers, each in its own session
        output, returncode = proc.stdout.read() if proc.stdout else "", None
    outcome.seconds = round(time.monotonic() - start, 1)
    outcome.ranks = [json.loads(p.read_text()) for p in sorted(reports.glob("rank*.json"))]
    lines = output.splitlines()
    summary = [i for i, line in enumerate(lines) if "failed (exitcode:" in line]  # torchrun
    outcome.tail = "\n".join(lines[:summary[0] if summary else len(lines)][-8:])
    judge(outcome, returncode, outcome.ranks)
    return outcome


def run_lesson(launches: list[Launch], world_size_1: bool, timeout: float,
               hide_gpus: bool) -> list[Outcome]:
    """A lesson's launches in its order, in one folder (a later one may read what an
    earlier one wrote, as in the lesson): each at world size 1, or at the lesson's own."""
    with tempfile.TemporaryDirectory(prefix="ddp-gpu-check-") as tmp:
        outcomes = [run(x, 1 if world_size_1 else x.nproc, timeout, hide_gpus, tmp)
                    for x in launches]
    deciding = not world_size_1 or all(x.nproc == 1 for x in launches)
    for o in outcomes:
        o.deciding = deciding
    return outcomes


def machine(hide_gpus: bool) -> dict:
    import torch

    gpu = "none (GPUs hidden)" if hide_gpus else (
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
    return {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat()}


def table(outcomes: list[Outcome]) -> str:
    lines = ["| lesson | script | ranks | backend | result | decides | seconds |",
             "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.lesson} | `{Path(o.script).name}` | {o.nproc} | {o.backend} | "
                     f"{o.status} | {'yes' if o.deciding else 'no'} | {o.seconds:g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", metavar="LOG",
                        help="write tools/gpu_launches.json from a CPU run's launch log")
    parser.add_argument("--only", help="comma-separated prefixes of the lessons to run")
    parser.add_argument("--jobs", type=int, default=4, help="launches at a time (default 4)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per launch")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: hide the GPUs (to try the check itself without one)")
    args = parser.parse_args(argv)
    if args.record:
        launches = launches_from_log(Path(args.record).read_text().splitlines())
        left_out = not_launched(launches)
        LAUNCHES.write_text(json.dumps({"launches": [asdict(x) for x in launches],
                                        "not_launched": left_out}, indent=1) + "\n")
        print(f"wrote {len(launches)} launches into {LAUNCHES.relative_to(REPO)}; left out, "
              "as no lesson launches them with torchrun on one node and exit status 0 "
              "(they fail on purpose, or start several agents or plain processes):")
        for script in left_out:
            print(f"  {script}")
        return 0
    hide = args.device == "cpu"
    import torch

    if not hide and not torch.cuda.is_available():
        print("gpu-check: no GPU is visible to torch here (a CPU build, or no device). On a "
              "GPU machine, install the CUDA build of torch==2.13.0 (README, *Running on "
              "GPUs*) and run it again.", file=sys.stderr)
        return 2
    launches = read_launches()
    if args.only:
        prefixes = tuple(args.only.split(","))
        launches = [x for x in launches if x.lesson.startswith(prefixes)]
    lessons = {}
    for x in launches:
        lessons.setdefault(x.lesson, []).append(x)
    jobs = [(group, one) for group in lessons.values() for one in (True, False)
            if one or any(x.nproc > 1 for x in group)]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        outcomes = [o for done in pool.map(
            lambda job: run_lesson(job[0], job[1], args.timeout, hide), jobs) for o in done]
    outcomes.sort(key=lambda o: (o.lesson, o.deciding))
    for o in outcomes:
        print(f"{o.lesson:24} {Path(o.script).name:24} {o.nproc} {o.backend:5} {o.status:16}"
              f" {o.seconds:6.1f} s")
        if not o.passed:
            print("    " + o.tail.replace("\n", "\n    "))
    # A lesson's own world size decides; world size 1 is reported (some scripts need 2).
    deciding = [o for o in outcomes if o.deciding]
    failed = [o for o in deciding if not o.passed]
    OUT.mkdir(parents=True, exist_ok=True)
    facts = machine(hide)
    (OUT / "report.json").write_text(json.dumps(
        {**facts, "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    (OUT / "report.md").write_text(
        f"GPU check: {facts['gpu']}, torch {facts['torch']} (CUDA {facts['cuda']}), "
        f"{facts['date']}: {len(deciding) - len(failed)} of {len(deciding)} launches passed "
        f"at their lesson's world size.\n\n{table(outcomes)}\n")
    print(f"{len(deciding) - len(failed)} of {len(deciding)} launches passed at their "
          f"lesson's world size; report in {OUT.relative_to(REPO)}/report.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
