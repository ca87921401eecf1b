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
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _CAP_SYS_PTRACE, _CAP_SYS_ADMIN = 4, 24, 19, 21


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


_PSEUDO = {"proc", "sysfs", "devtmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "securityfs",
           "debugfs", "tracefs", "configfs", "fusectl", "pstore", "bpf", "hugetlbfs",
           "binfmt_misc", "autofs", "nsfs", "efivarfs", "selinuxfs"}


def _file_mounts() -> list[str]:
    """The mount points of files (not /proc, /sys, /dev or another kernel interface)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")  # "\\040" is a space
        fstype = fields[fields.index("-") + 1]
        if fstype in _PSEUDO or any(point == p or point.startswith(p + "/")
                                    for p in ("/proc", "/sys", "/dev")):
            continue
        found.append(point)
    return found


def _bind(libc, source: Path, target: Path, writable: bool | None) -> None:
    """`source` shown at `target`, with what is mounted inside it; read-only, writable, or
    (None) as it is."""
    _mount(libc, source, target, None, _MS_BIND | _MS_REC)
    if writable is not None:
        _mount(libc, None, target, None,
               _MS_BIND | _MS_REMOUNT | (0 if writable else _MS_RDONLY))


def confine(read_only: list[Path], hidden: dict[Path, dict[Path, bool]], stage: Path,
            keep_mounting: bool = False, private: dict | None = None,
            whole_machine: bool = False, no_tracing: bool = False) -> None:
    """In a process already in a mount namespace of its own: every file read-only (with
    `keep_mounting`, for lessons that build hosts: only the folders of `read_only`); each
    folder of `hidden` replaced by an empty read-only one that shows only its `{path inside
    it: writable}`; each folder of `private` (the temporary folders, caches) by an empty
    writable one of its own that shows only its `{path inside it: None}` as they are; then,
    unless `keep_mounting`, no more mounting. `stage`: an empty folder, for the making.
    `whole_machine`: every file read-only, not only `read_only`; `no_tracing`: what it
    starts may not trace this process or its children (see below). A server of warm
    launches (tools/zygote.py) must be started after this, by a process inside: one from
    outside forks its children outside the view (and its socket, in a private /tmp, is
    not seen)."""
    libc = _libc()
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount(libc, "tmpfs", stage, "tmpfs", 0, "size=1m,mode=700")  # writable, whatever else is
    # reached through this process's open folder, even once a mask covers its path
    handle = os.open(stage, os.O_RDONLY | os.O_DIRECTORY)
    made_here = str(Path(stage).resolve())
    stage = Path(f"/proc/self/fd/{handle}")
    if keep_mounting or not whole_machine:
        for folder in read_only:
            if Path(folder).is_dir():
                _bind(libc, Path(folder), Path(folder), writable=False)
    else:
        for point in _file_mounts():
            if point == made_here:
                continue
            try:
                _mount(libc, None, point, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)
            except OSError:
                if point == "/" or any(Path(f) == Path(point) or Path(point) in Path(f).parents
                                       for f in read_only):
                    raise
    masks = [(Path(f), shown, False) for f, shown in hidden.items()] + \
            [(Path(f), shown, True) for f, shown in (private or {}).items()]
    # hidden ones first, then the private ones (whose contents shown carry them), each the
    # deepest first, so that a folder inside another is shown as it now is
    masks.sort(key=lambda m: (m[2], -len(m[0].parts)))
    for k, (folder, shown, writable) in enumerate(masks):
        if not folder.is_dir():
            continue
        made = stage / str(k)
        made.mkdir()
        mode = "1777" if writable and str(folder) in ("/tmp", "/var/tmp", "/dev/shm") else (
            "700" if writable else "755")
        _mount(libc, "tmpfs", made, "tmpfs", 0, f"mode={mode}" + ("" if writable else ",size=1m"))
        for path, path_writable in sorted(shown.items()):
            path = Path(path)
            if not path.exists() or folder not in path.parents:
                continue
            point = made / path.relative_to(folder)
            if path.is_dir():
                point.mkdir(parents=True, exist_ok=True)
            else:
                point.parent.mkdir(parents=True, exist_ok=True)
                point.touch()
            _bind(libc, path, point, path_writable)
        if not writable:
            _mount(libc, None, made, None, _MS_REMOUNT | _MS_RDONLY)
        _mount(libc, made, folder, None, _MS_MOVE)
    os.close(handle)
    # No process started from here on may trace or read (/proc/PID/fd, mem) this one or
    # the judge: they hold rights it lacks (and are not dumpable). Where Yama asks for
    # CAP_SYS_PTRACE to trace a process that is not a child (ptrace_scope 1 and up), py-spy
    # needs that right in lessons 13 and 25, and it stays.
    drop = ([] if keep_mounting else [("CAP_SYS_ADMIN", _CAP_SYS_ADMIN)]) + (
        [("CAP_SYS_PTRACE", _CAP_SYS_PTRACE)] if no_tracing and _tracing_is_free() else [])
    import ctypes

    for name, capability in drop:
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"dropping {name}: {os.strerror(error)}")
    if no_tracing:
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _tracing_is_free() -> bool:
    """Whether a process may trace another of its user's without CAP_SYS_PTRACE (no Yama,
    or its ptrace_scope 0)."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() == "0"
    except OSError:
        return True
