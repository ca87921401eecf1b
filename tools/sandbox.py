"""`make grade`'s limits on a student's code: memory, processes, file sizes, and no process
left behind.

Each student's kernel, and everything it starts, runs with resource limits (a file it
writes is capped in size, no core dumps) and, as root (CI, a grading server), in control
groups of its own that cap its memory and its processes and threads together; when the
student is done, every process in those groups is killed, also one that left the
kernel's session and cleared its environment. Without root, each process has an address
space limit instead, and the processes left behind are found by the marker in their
environment (tools/grade.py), which a process can clear.

The kernel takes its limits from the environment variable ENV (a JSON object), and passes
it on to what it launches: tools/zygote.py `enter_sandbox` applies them in a forked kernel
or launch, `prlimit` in a kernel started cold (tools/warm_kernel.py); a cold launch
inherits them. A student's code can clear the variable before a warm launch; the launch
then escapes the control groups, not the marker's clean-up.

What this does not do: run a student's code as another user. The course's Python here
lives under a folder only root may enter, so another user could not run it; a student's
code runs as the grader's user, and tools/grade.py checks and puts back, after each
student, the course files that student's code could reach.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tools.zygote import SANDBOX as ENV

MEMORY_BYTES = 8 << 30  # a student's processes together (a control group), or each one
PROCESSES = 4096  # threads count: torch's ranks each run dozens
FILE_BYTES = 256 << 20  # the largest file a student's code may write
CGROUP_PREFIX = "ddp-grade-"


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _cgroup_parents() -> list[Path]:
    """Where control groups can be made (cgroup v1: memory and pids; v2: one), as root."""
    base = Path("/sys/fs/cgroup")
    v1 = [base / "memory", base / "pids"]
    if all((d / "cgroup.procs").exists() for d in v1):
        return v1
    if (base / "cgroup.controllers").exists():
        return [base]
    return []


@dataclass
class Sandbox:
    """The limits of one student's lessons, and the control groups that hold their
    processes."""
    name: str
    cgroups: tuple[str, ...] = ()

    @classmethod
    def make(cls, name: str) -> Sandbox:
        cgroups = []
        if is_root():
            for parent in _cgroup_parents():
                folder = parent / f"{CGROUP_PREFIX}{name}-{os.getpid()}"
                settings = {"memory": {"memory.limit_in_bytes": MEMORY_BYTES},  # v1
                            "pids": {"pids.max": PROCESSES}}.get(
                    parent.name, {"memory.max": MEMORY_BYTES, "pids.max": PROCESSES})  # v2
                try:
                    folder.mkdir(exist_ok=True)
                    for setting, value in settings.items():
                        (folder / setting).write_text(str(value))
                    cgroups.append(str(folder))
                except OSError:  # a controller we may not use: resource limits instead
                    if folder.exists():
                        _remove_cgroup(folder)
        return cls(name, tuple(cgroups))

    @property
    def memory_capped(self) -> bool:
        return any(not c.startswith("/sys/fs/cgroup/pids") for c in self.cgroups)

    def describe(self) -> str:
        memory = (f"{MEMORY_BYTES >> 30} GiB of memory for all its processes together, "
                  f"{PROCESSES} processes and threads" if self.memory_capped else
                  f"{2 * MEMORY_BYTES >> 30} GiB of address space per process (not root: no "
                  f"control group)")
        return (f"each student's code ran with {memory}, files up to {FILE_BYTES >> 20} MiB, "
                f"as the grader's own user")

    def spec(self) -> dict:
        return {"cgroups": list(self.cgroups), "limits": limits(self.memory_capped)}

    def environment(self) -> dict:
        return {ENV: json.dumps(self.spec())}

    def processes(self) -> list[int]:
        found = set()
        for folder in self.cgroups:
            try:
                found |= {int(p) for p in Path(folder, "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found - {os.getpid()})

    def kill_all(self) -> int:
        """Kill every process in the sandbox's control groups; how many there were."""
        left = self.processes()
        for _ in range(40):
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        return len(left)

    def remove(self) -> None:
        self.kill_all()
        for folder in self.cgroups:
            _remove_cgroup(Path(folder))

    def describe_and_remove(self) -> str:
        """What a sandbox made here gives (the grader says it once, before the class)."""
        try:
            return self.describe()
        finally:
            self.remove()


def remove_left_over(name: str, pid: int) -> None:
    """The control groups of the sandbox `name` that process `pid` made and could not
    remove (it was killed): their processes killed, the groups removed."""
    Sandbox(name, tuple(str(parent / f"{CGROUP_PREFIX}{name}-{pid}")
                        for parent in _cgroup_parents()
                        if (parent / f"{CGROUP_PREFIX}{name}-{pid}").exists())).remove()


def _remove_cgroup(folder: Path) -> None:
    for _ in range(40):  # a killed process leaves its group a moment later
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def limits(memory_capped: bool) -> dict:
    """Resource limits for every process of the sandbox (what a control group does not
    already cap)."""
    found = {"RLIMIT_FSIZE": FILE_BYTES, "RLIMIT_CORE": 0}
    if not memory_capped:
        found["RLIMIT_AS"] = 2 * MEMORY_BYTES  # per process: address space, not memory
    return found


def wrap_command(spec: dict, argv: list[str]) -> list[str]:
    """A cold kernel's command under the same limits (prlimit, from util-linux); its
    control groups are not joined."""
    flags = {"RLIMIT_FSIZE": "--fsize", "RLIMIT_CORE": "--core", "RLIMIT_AS": "--as"}
    limited = [f"{flags[name]}={value}" for name, value in spec.get("limits", {}).items()]
    if limited and shutil.which("prlimit"):
        return ["prlimit", *limited, "--", *argv]
    return list(argv)
