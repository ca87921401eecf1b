"""`make soak`: the whole course on a busy machine, as on a learner's laptop that is also
running a browser, a video call or an IDE. Keeps the cores busy (one endless loop per core,
or `--busy N`) while it runs the course `--courses` times in a row, then, with `--tests`,
the launch-heavy tests; reports every failure with its lesson and its cell, and the load.

    python -m tools.course_soak [--courses 3] [--busy N] [--tests] [--report PATH]

The busy loops run at normal priority, as another program would; they and everything the
course starts are stopped at the end, also on Ctrl-C. Exits 1 if anything failed. The
report (build/soak/report.md) holds a table per run: each lesson's seconds and status,
and the load average sampled while it ran.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The tests that start the most processes: the scripts' own, the launcher's, the warm one.
LAUNCH_HEAVY_TESTS = ["tests/test_scripts.py", "tests/test_launch.py", "tests/test_warm.py"]
BUSY_LOOP = "while True: pass"


def start_busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
            for _ in range(n)]


def stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


class LoadWatch(threading.Thread):
    """Samples the 1-minute load average every few seconds while a run goes on."""

    def __init__(self, every_s: float = 5.0):
        super().__init__(daemon=True)
        self.every_s, self.samples, self.done = every_s, [], threading.Event()

    def run(self):
        while not self.done.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> str:
        if not self.samples:
            return "no sample"
        return (f"load average {min(self.samples):.1f} to {max(self.samples):.1f} "
                f"(mean {sum(self.samples) / len(self.samples):.1f})")


def run_logged(command: list[str], log: Path) -> tuple[int, str, float]:
    """Run `command` in its own session, its output into `log` and echoed; stop it whole."""
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            for line in process.stdout:
                out.write(line)
                print(line, end="", flush=True)
            process.wait()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return process.returncode, log.read_text(), time.monotonic() - start


LESSON_LINE = re.compile(r"^\[\d+/\d+\] (\S+\.ipynb): (ok|FAILED|skipped) in ([\d.]+) s$", re.M)
CELL = re.compile(r'Exception encountered at "(In \[\d+\])"')


def course_results(output: str) -> list[dict]:
    """Each lesson's status and seconds from `tools.run_course`'s output, and for a failed
    lesson the cell and the last line of its error."""
    results = []
    for m in LESSON_LINE.finditer(output):
        found = {"lesson": m[1], "status": m[2], "seconds": float(m[3]), "cell": "", "error": ""}
        if m[2] == "FAILED":
            before = output[:m.start()]
            block = before[before.rfind(f"{m[1]} failed:"):]
            cell = CELL.search(block)
            found["cell"] = cell[1] if cell else "?"
            errors = [line for line in block.splitlines()
                      if re.match(r"\w*(Error|Exception)", line)]
            found["error"] = errors[-1][:200] if errors else block.splitlines()[-1][:200]
        results.append(found)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--courses", type=int, default=3, help="whole courses in a row")
    parser.add_argument("--busy", type=int, default=os.cpu_count(),
                        help="busy loops kept running (default: one per core)")
    parser.add_argument("--tests", action="store_true",
                        help="then the launch-heavy tests: " + ", ".join(LAUNCH_HEAVY_TESTS))
    parser.add_argument("--report", type=Path, default=REPO / "build" / "soak" / "report.md")
    args = parser.parse_args(argv)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# make soak: {args.courses} course(s) with {args.busy} busy loop(s) on "
             f"{os.cpu_count()} core(s), {time.strftime('%Y-%m-%d %H:%M')}", ""]
    failures = 0
    busy = start_busy(args.busy)
    try:
        for k in range(1, args.courses + 1):
            watch = LoadWatch()
            watch.start()
            code, output, seconds = run_logged(
                [sys.executable, "-m", "tools.run_course", "--build",
                 str(args.report.parent / f"course-{k}")],
                args.report.parent / f"course-{k}.log")
            watch.done.set()
            results = course_results(output)
            failed = [r for r in results if r["status"] == "FAILED"]
            failures += len(failed) + (code != 0 and not failed)
            lines += [f"## Course {k}: {len(failed)} failed, {seconds:.0f} s, {watch.summary()}",
                      "", "| lesson | status | seconds | cell | error |", "|---|---|---|---|---|"]
            lines += [f"| {r['lesson']} | {r['status']} | {r['seconds']:.1f} | {r['cell']} | "
                      f"{r['error'].replace('|', '/')} |" for r in results]
            lines.append("")
        if args.tests:
            watch = LoadWatch()
            watch.start()
            code, output, seconds = run_logged(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 *LAUNCH_HEAVY_TESTS], args.report.parent / "tests.log")
            watch.done.set()
            failing = re.findall(r"^FAILED (\S+)", output, re.M)
            failures += len(failing) + (code != 0 and not failing)
            lines += [f"## Launch-heavy tests: exit {code}, {seconds:.0f} s, {watch.summary()}",
                      ""] + [f"- FAILED {name}" for name in failing] + [""]
    finally:
        stop(busy)
        args.report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"report: {args.report}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
