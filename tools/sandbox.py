"""`make grade`'s limits on a student's code: memory, processes, file sizes, and no process
left behind.

tools/grade.py grades each student in a process of its own, which enters the student's
sandbox before it runs anything (`enter`, given to Popen as preexec_fn): everything it
starts, the student's kernels, their launches and whatever those start, inherits it. As
root (CI, a grading server) the sandbox is a control group (cgroup v1's memory and pids,
or one of cgroup v2) that caps the memory and the processes and threads of all of them
together; when the student is done, the group is closed to new processes and every
process in it is killed, also one that left the kernel's session and cleared its
environment. Resource limits cap the size of a file, core dumps, and without root the
data of each process.

What this does not do: run a student's code as another user. The course's Python here
lives under a folder only root may enter, so another user could not run it; the students'
code runs as the grader's user, which may leave a control group, lift a limit, or signal
the grader (README, *For instructors*).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def _settings(parent: Path) -> dict:
    return {"memory": {"memory.limit_in_bytes": MEMORY_BYTES},  # v1
            "pids": {"pids.max": PROCESSES}}.get(
        parent.name, {"memory.max": MEMORY_BYTES, "pids.max": PROCESSES})  # v2


@dataclass
class Sandbox:
    """One student's control groups (none without root) and limits."""
    name: str
    cgroups: tuple[str, ...] = ()
    capped: tuple[str, ...] = ()  # what the groups cap: "memory", "processes"

    @classmethod
    def make(cls, name: str) -> Sandbox:
        cgroups, capped = [], set()
        if is_root():
            for parent in _cgroup_parents():
                folder = parent / f"{CGROUP_PREFIX}{name}"
                try:
                    folder.mkdir(exist_ok=True)
                except OSError:
                    continue
                cgroups.append(str(folder))
                for setting, value in _settings(parent).items():
                    try:  # a setting refused: the group still holds (and kills) them
                        (folder / setting).write_text(str(value))
                        capped.add("memory" if setting.startswith("memory") else "processes")
                    except OSError:
                        pass
        return cls(name, tuple(cgroups), tuple(sorted(capped)))

    def limits(self) -> dict:
        """Resource limits for every process of the sandbox."""
        found = {"RLIMIT_FSIZE": FILE_BYTES, "RLIMIT_CORE": 0}
        if "memory" not in self.capped:  # per process, data (not address space: CUDA
            found["RLIMIT_DATA"] = 2 * MEMORY_BYTES  # reserves far more than it uses)
        return found

    def enter(self) -> None:
        """In the process about to grade the student (Popen's preexec_fn): join the
        groups, take the limits. Everything it starts inherits both."""
        for folder in self.cgroups:
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        for name, value in self.limits().items():
            kind = getattr(resource, name)
            _, hard = resource.getrlimit(kind)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(kind, (value, value))

    def describe(self) -> str:
        parts = []
        if "memory" in self.capped:
            parts.append(f"{MEMORY_BYTES >> 30} GiB of memory for all its processes together")
        else:
            parts.append(f"{2 * MEMORY_BYTES >> 30} GiB of data per process")
        if "processes" in self.capped:
            parts.append(f"{PROCESSES} processes and threads")
        parts.append(f"files up to {FILE_BYTES >> 20} MiB")
        held = ("in a control group, whose processes were all killed when it was done"
                if self.cgroups else "no control group (not root): its processes were "
                "found and killed by a marker in their environment, which a process can clear")
        return f"each student's code ran with {', '.join(parts)}; {held}"

    def processes(self) -> list[int]:
        found = set()
        for folder in self.cgroups:
            try:
                found |= {int(p) for p in Path(folder, "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found - {os.getpid()})

    def kill_all(self) -> int:
        """Close the groups to new processes, kill every process in them; how many."""
        for folder in self.cgroups:
            for closing in ("cgroup.kill", "pids.max"):  # v2's kill, or no more forks
                path = Path(folder, closing)
                if path.exists():
                    try:
                        path.write_text("1" if closing == "cgroup.kill" else "0")
                    except OSError:
                        pass
        left = self.processes()
        for _ in range(100):
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

    def remove(self) -> list[str]:
        """Kill what is left, remove the groups; the groups that could not be removed."""
        self.kill_all()
        return [folder for folder in self.cgroups if not _remove_cgroup(Path(folder))]

    def describe_and_remove(self) -> str:
        try:
            return self.describe()
        finally:
            self.remove()


def _remove_cgroup(folder: Path) -> bool:
    for _ in range(100):  # a killed process leaves its group a moment later
        try:
            folder.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.05)
    return False


def remove_stale() -> list[str]:
    """The groups of graders that were killed (the grader's pid ends the group's name, and
    it is gone): emptied and removed."""
    stale = []
    for parent in _cgroup_parents():
        for folder in parent.glob(f"{CGROUP_PREFIX}*"):
            owner = folder.name.rsplit("-", 1)[-1]
            if folder.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                stale.append(str(folder))
    return Sandbox("stale", tuple(stale)).remove()


# A view of the files of its own ------------------------------------------------------------
# As root, a student's grading process runs in a mount and PID namespace of its own
# (`confined_command`): it sees no process but its own, and (`confine`) the instructor's
# course and the class's hand-ins read-only, the instructor's notebooks (solutions and
# hidden checks), the repository's history and other builds not at all, and of the grading
# folder only its own course, its own executed notebooks and the clean copy (read-only).
# Then it gives up the right to mount (CAP_SYS_ADMIN leaves the bounding set), so no
# process it starts can undo this; lessons that build hosts (32, 34) need that right, and
# keep it.

_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = (
    1, 32, 4096, 8192, 16384, 1 << 18)
_PR_CAPBSET_DROP, _CAP_SYS_ADMIN = 24, 21


_CONFINES: list[bool] = []


def can_confine() -> bool:
    """Whether grading here can use namespaces: Linux, root, util-linux's `unshare`, and a
    kernel and container that let it (a container without CAP_SYS_ADMIN does not): tried
    once, with a command that does nothing."""
    import shutil
    import subprocess

    if not _CONFINES:
        works = sys.platform.startswith("linux") and is_root() and bool(shutil.which("unshare"))
        if works:
            try:
                works = subprocess.run(confined_command(["true"]), capture_output=True,
                                       timeout=30).returncode == 0
            except (OSError, subprocess.SubprocessError):
                works = False
        _CONFINES.append(works)
    return _CONFINES[0]


def confined_command(command: list[str]) -> list[str]:
    """`command` in a PID and mount namespace of its own, with its own /proc."""
    return ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private", *command]


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    import ctypes

    def enc(value):
        return None if value is None else str(value).encode()

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def _bind(libc, source: Path, target: Path, writable: bool) -> None:
    _mount(libc, source, target, None, _MS_BIND | _MS_REC)
    _mount(libc, None, target, None,
           _MS_BIND | _MS_REMOUNT | (0 if writable else _MS_RDONLY))


def confine(read_only: list[Path], hidden: dict[Path, dict[Path, bool]],
            keep_mounting: bool = False) -> None:
    """In a process already in a mount namespace of its own: every folder of `read_only`
    read-only; each folder of `hidden` replaced by an empty read-only one that shows only
    its `{path inside it: writable}`; then, unless `keep_mounting`, no more mounting."""
    libc = _libc()
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    for folder in read_only:
        if Path(folder).is_dir():
            _bind(libc, Path(folder), Path(folder), writable=False)
    # the deepest first, so that a hidden folder inside another is shown as it now is
    for folder in sorted(hidden, key=lambda p: -len(Path(p).parts)):
        folder = Path(folder)
        if not folder.is_dir():
            continue
        stage = Path(tempfile.mkdtemp(prefix="ddp-grade-view-"))
        _mount(libc, "tmpfs", stage, "tmpfs", 0, "size=1m,mode=755")
        for shown, writable in sorted(hidden[folder].items()):
            shown = Path(shown)
            if not shown.exists():
                continue
            point = stage / shown.relative_to(folder)
            if shown.is_dir():
                point.mkdir(parents=True, exist_ok=True)
            else:
                point.parent.mkdir(parents=True, exist_ok=True)
                point.touch()
            _bind(libc, shown, point, writable)
        _mount(libc, None, stage, None, _MS_REMOUNT | _MS_RDONLY)
        _mount(libc, stage, folder, None, _MS_MOVE)
        stage.rmdir()
    if not keep_mounting:
        import ctypes

        if libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_ADMIN, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"dropping CAP_SYS_ADMIN: {os.strerror(error)}")
