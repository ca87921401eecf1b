"""Two hosts and a Slurm cluster on this one machine, for lesson 32.

Each "host" is a Linux network namespace with its own interface ``eth0`` and address,
joined to the other by a virtual bridge: what crosses between them is real TCP over
real (virtual) network interfaces, exactly what crosses between two machines. A command
runs "on" a host through ``on(host, argv)``, which also gives it the host's own name and
``/etc/hosts``. Slurm's controller and one ``slurmd`` per host make the cluster.

    python -m tools.cluster install     # the Debian packages it needs, if missing (apt-get)
    python -m tools.cluster up          # install Slurm if missing, create the hosts, start Slurm
    python -m tools.cluster status      # what is up
    python -m tools.cluster down        # remove everything (unless a live process owns it)
    python -m tools.cluster leftovers   # exit status 1 if anything of ours is left

It needs root (namespaces and links need CAP_NET_ADMIN and CAP_SYS_ADMIN) and Linux.
``down`` removes every process in the namespaces, the namespaces, the bridge and the
state folder, and then checks that nothing is left. ``up`` registers ``down`` to run when
the Python process exits, and a failed ``up`` tears down what it had made, so that a
lesson or test that fails half-way leaves nothing behind. Only the addresses below, in
the namespaces this tool creates, are ever contacted.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES_FILE = Path(__file__).with_name("cluster-packages.txt")

HOSTS = {"nodeA": "10.77.0.1", "nodeB": "10.77.0.2"}  # host name: address on eth0
PREFIX = "ddpc"  # every namespace and link this tool makes starts with it
BRIDGE = f"{PREFIX}-br"
IFACE = "eth0"  # each host's interface, named as on a typical cluster node
STATE = Path(tempfile.gettempdir()) / "ddp-course-cluster"  # configs, logs, job output
SLURM_PROCESSES = ("slurmctld", "slurmd", "slurmstepd")
SLURM_UP_TIMEOUT_S = 20


class ClusterError(RuntimeError):
    pass


def netns(host: str) -> str:
    return f"{PREFIX}-{host}"


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command on this machine (not on a host); raise with its stderr if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise ClusterError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


# ---------------------------------------------------------------------- can it run here?

def why_not() -> str | None:
    """None when this machine can run the cluster, otherwise the reason and what to do."""
    if sys.platform != "linux":
        return (f"this is {sys.platform}, not Linux: the two hosts are Linux network "
                "namespaces. Run the course in a Linux container started with --privileged "
                "(for example `docker run --privileged -it debian:12`), or take the scripts of "
                "this lesson to a real cluster.")
    if os.geteuid() != 0:
        return ("this lesson needs root: creating network namespaces and virtual links needs "
                "the capabilities CAP_NET_ADMIN and CAP_SYS_ADMIN, and installing Slurm needs "
                "apt-get. Run JupyterLab as root in a Linux container started with "
                "--privileged (or `--cap-add NET_ADMIN --cap-add SYS_ADMIN`), or take the "
                "scripts of this lesson to a real cluster.")
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing: install util-linux and mount."
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True,
                           text=True, timeout=30)
    if probe.returncode:
        return ("root, but without the capabilities to make namespaces (CAP_SYS_ADMIN, "
                f"CAP_NET_ADMIN): `unshare --net --mount true` said {probe.stderr.strip()!r}. "
                "In a container, start it with --privileged (or `--cap-add NET_ADMIN "
                "--cap-add SYS_ADMIN`).")
    if shutil.which("apt-get") is None and missing_packages():
        return (f"the Debian packages {', '.join(missing_packages())} are missing and this "
                "system has no apt-get: install Slurm (slurmctld, slurmd, the clients) and "
                "iproute2 with its own package manager.")
    return None


# ------------------------------------------------------------------------- the packages

def packages() -> list[str]:
    lines = PACKAGES_FILE.read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def missing_packages() -> list[str]:
    if shutil.which("dpkg-query") is None:
        return [p for p in packages() if shutil.which({"iproute2": "ip"}.get(p, p)) is None]
    return [p for p in packages()
            if sh("dpkg-query", "-W", "-f=${Status}", p, check=False).stdout
            != "install ok installed"]


def install() -> list[str]:
    """Install the packages of tools/cluster-packages.txt that are missing (apt-get);
    return their names."""
    missing = missing_packages()
    if missing:
        print(f"[cluster] installing {' '.join(missing)} (apt-get)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
            if done.returncode:
                raise ClusterError(f"`{' '.join(argv)}` failed: {done.stderr.strip()[-2000:]}")
    return missing


# ------------------------------------------------------------------------------ the hosts

def hosts_file(host: str) -> str:
    """/etc/hosts as Debian's installer writes it on `host`: its own name on 127.0.1.1, so
    that the name works before any network is up; the other hosts on their addresses."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{host}"]
    lines += [f"{address}\t{name}" for name, address in HOSTS.items() if name != host]
    return "\n".join(lines) + "\n"


def on(host: str, argv: list[str]) -> list[str]:
    """`argv` as it runs on `host`: in its network namespace, with its own host name and
    /etc/hosts (and a resolv.conf that asks only the host's own loopback), all in private
    mount and UTS namespaces, so that this machine's files and name are left alone.
    nsenter keeps /sys as it is (slurmd needs /sys/fs/cgroup; `ip netns exec` remounts /sys)."""
    script = ('mount --bind "$1" /etc/hosts && '
              '{ [ ! -e /etc/resolv.conf ] || mount --bind "$2" /etc/resolv.conf; } && '
              'hostname "$3" && shift 3 && exec "$@"')
    return ["unshare", "--uts", "--mount", "nsenter", f"--net=/run/netns/{netns(host)}",
            "sh", "-c", script, "sh", str(STATE / f"hosts.{host}"), str(STATE / "resolv.conf"),
            host, *argv]


def namespaces(host: str) -> dict:
    """What `on` enters for `host`, for a process forked from the warm server instead
    (tools/zygote.py does the same steps: new UTS and mount namespaces, the host's network
    namespace, its /etc/hosts and resolv.conf bound in, its host name)."""
    return {"netns": f"/run/netns/{netns(host)}", "hosts": str(STATE / f"hosts.{host}"),
            "resolv": str(STATE / "resolv.conf"), "hostname": host}


def run_on(host: str, *argv: str, check: bool = True, timeout: float = 30,
           env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(on(host, list(argv)), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    if check and done.returncode:
        raise ClusterError(f"on {host}: `{' '.join(argv)}` failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


def create_hosts() -> None:
    """The bridge, and for each host a namespace with eth0 plugged into the bridge."""
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")
    for i, (host, address) in enumerate(HOSTS.items()):
        ns, outside = netns(host), f"{PREFIX}-v{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", IFACE, "netns", ns)
        sh("ip", "link", "set", outside, "master", BRIDGE)
        sh("ip", "link", "set", outside, "up")
        sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFACE)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", IFACE, "up")
        (STATE / f"hosts.{host}").write_text(hosts_file(host))
    (STATE / "resolv.conf").write_text("nameserver 127.0.0.1\n")


def set_link(host: str, up: bool) -> None:
    """Plug `host`'s cable in (up) or pull it out (down)."""
    sh("ip", "-n", netns(host), "link", "set", IFACE, "up" if up else "down")


# ------------------------------------------------------------------------------ Slurm

def slurm_conf() -> str:
    head = next(iter(HOSTS))
    nodes = "\n".join(f"NodeName={h} NodeAddr={a} CPUs=2 RealMemory=1000 State=UNKNOWN"
                      for h, a in HOSTS.items())
    return f"""\
# Written by tools/cluster.py. A two-node cluster whose controller runs on {head}.
ClusterName=ddpcourse
SlurmctldHost={head}({HOSTS[head]})
SlurmUser=root
SlurmdUser=root
# No munge: on this one machine every request comes from root. A real cluster uses munge.
AuthType=auth/none
CredType=cred/none
StateSaveLocation={STATE}/slurm/state
SlurmdSpoolDir={STATE}/slurm/spool/%n
SlurmctldPidFile={STATE}/slurm/slurmctld.pid
SlurmdPidFile={STATE}/slurm/slurmd-%n.pid
SlurmctldLogFile={STATE}/slurm/slurmctld.log
SlurmdLogFile={STATE}/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={STATE}/slurm/jobs.log
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP
"""


def slurm_env() -> dict:
    """What Slurm's commands need: where the configuration is, and a PATH with the sbin
    folders, where Debian puts its daemons (a minimal environment's PATH may lack them)."""
    path = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    path += [folder for folder in ("/usr/local/sbin", "/usr/sbin", "/sbin") if folder not in path]
    return {"SLURM_CONF": str(STATE / "slurm" / "slurm.conf"), "PATH": os.pathsep.join(path)}


def start_slurm() -> None:
    for folder in ("state", "spool"):
        (STATE / "slurm" / folder).mkdir(parents=True, exist_ok=True)
    (STATE / "slurm" / "slurm.conf").write_text(slurm_conf())
    head = next(iter(HOSTS))
    run_on(head, "slurmctld", env=slurm_env())
    for host in HOSTS:
        run_on(host, "slurmd", env=slurm_env())
    deadline = time.monotonic() + SLURM_UP_TIMEOUT_S
    while True:
        states = run_on(head, "sinfo", "-h", "-N", "-o", "%N %T", env=slurm_env(),
                        check=False).stdout.split()
        if states.count("idle") == len(HOSTS):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"Slurm's nodes not idle after {SLURM_UP_TIMEOUT_S} s: {states}; "
                               f"see {STATE}/slurm/*.log")
        time.sleep(0.2)


def slurm(*argv: str, timeout: float = 30, check: bool = True) -> str:
    """A Slurm command (sbatch, squeue, sinfo ...) run on the head node; its stdout."""
    return run_on(next(iter(HOSTS)), *argv, env=slurm_env(), timeout=timeout,
                  check=check).stdout


@dataclass
class Job:
    """A finished Slurm job: what squeue showed while it ran, how it ended, its output."""
    job_id: str
    state: str  # as Slurm's job completion log records it: COMPLETED, FAILED, TIMEOUT ...
    seconds: float  # from sbatch to the job leaving the queue
    squeue: list[str]  # each new line `squeue` printed for it, in order
    completion: str  # its line in the job completion log
    output: str  # what its tasks printed (--output)
    data: dict | None = None  # rank 0's JSON, when --out was given


def sbatch(script: str, *args: str, options: tuple = (), timeout: float = 60,
           cwd: str | Path | None = None, out: bool = False, echo: bool = True,
           check: bool = True) -> Job:
    """Submit a batch script from the head node (`options` go to sbatch and override the
    script's #SBATCH lines, `args` to the script), watch it in squeue until it has left
    the queue (cancelled after `timeout` s), and return how it ended; with `check`, raise
    unless it COMPLETED (and wrote its JSON, with `out`). The job inherits this
    process's environment (sbatch's default), so `python` and `torchrun` are the course's."""
    if cwd is None:  # the course the lesson runs in
        from tools.launch import course_root
        cwd = course_root()
    (STATE / "jobs").mkdir(exist_ok=True)
    args = list(args)
    if out:
        out_path = STATE / "jobs" / f"{Path(script).stem}-{time.monotonic_ns()}.json"
        args += ["--out", str(out_path)]
    env = {**slurm_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = ["sbatch", *options, script, *args]
    if echo:
        print(f"{next(iter(HOSTS))}$ {' '.join(command)}", flush=True)
    command[1:1] = ["--parsable", f"--output={STATE}/jobs/%x-%j.out"]
    start = time.monotonic()
    done = subprocess.run(on(next(iter(HOSTS)), command), capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **env}, timeout=30)
    if done.returncode:
        raise ClusterError(f"sbatch refused {script}: {done.stderr.strip()}")
    job_id = done.stdout.strip().split(";")[0]
    lines = []
    while True:
        line = slurm("squeue", "-h", "-j", job_id, "-o", "%i %j %T %M %D %N", check=False)
        if not line.strip():
            break
        state = line.split()[2]
        if not lines or lines[-1].split()[2] != state:
            lines.append(line.strip())
            if echo:
                print(f"squeue: {line.strip()}", flush=True)
        if time.monotonic() - start > timeout:
            slurm("scancel", job_id, check=False)
            raise ClusterError(f"job {job_id} still in the queue after {timeout:g} s: "
                               f"cancelled.\n{_job_output(job_id)[-3000:]}")
        time.sleep(0.1)
    seconds = time.monotonic() - start
    completion = next((line for line in _text(STATE / "slurm" / "jobs.log").splitlines()
                       if f"JobId={job_id} " in line), "")
    state = completion.split("JobState=")[1].split()[0] if "JobState=" in completion else "?"
    job = Job(job_id, state, seconds, lines, completion, _job_output(job_id))
    if out and out_path.is_file():
        try:
            job.data = json.loads(out_path.read_text())
        except json.JSONDecodeError:
            job.data = None
    if echo:
        print(f"job {job_id}: {state} after {seconds:.1f} s", flush=True)
    if check and (state != "COMPLETED" or (out and job.data is None)):
        raise ClusterError(f"job {job_id} ({script}) ended {state}"
                           f"{'' if job.data or not out else ', without its JSON'}:\n"
                           f"{job.output[-3000:]}")
    return job


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _job_output(job_id: str) -> str:
    return "".join(_text(p) for p in sorted((STATE / "jobs").glob(f"*-{job_id}.out")))


# ------------------------------------------------------------------------ launching

def launch_on(runs: list[tuple[str, list[str]]], script: str, env: dict | None = None,
              independent: bool = False, cues=(), **options):
    """Launch commands on the hosts, together, as tools/launch.py launches on this machine
    (a timeout, the whole process group killed, the output streamed and captured, rank 0's
    JSON with out=True). `runs` holds (host, command as typed there): the command is
    `torchrun ...` or `python ...`, after any `NAME=value` words for its environment. With
    echo=False the commands are still shown, but not their output. Once one command fails
    the others are stopped, unless `independent`: then each lives on its own, as on
    machines of their own (an elastic job, whose hosts may die: lesson 26), and the
    result's `exit_codes` say how each ended. A run given as (host, command, when) starts
    once `when()` is True (a host that comes back), and says so then; each of `cues`,
    (when, action, what), runs `action()` once `when()` is True, and says `what`."""
    from tools import launch as launcher

    executable = {"torchrun": [sys.executable, "-m", "torch.distributed.run"],
                  "python": [sys.executable]}

    def build(args):
        processes = []
        for host, command, *when in runs:
            shown = [*command, *args]
            count = next(i for i, word in enumerate(shown) if "=" not in word)
            variables = dict(word.split("=", 1) for word in shown[:count])
            program = shown[count:]
            inside = [*executable[program[0]], *program[1:]]
            processes.append(launcher._Process(host, shown, on(host, inside), variables,
                                               host=host, inside=inside,
                                               namespaces=namespaces(host),
                                               on_its_own=independent,
                                               start_when=when[0] if when else None))
        return processes

    defaults = {"timeout": 120, "out": False, "expect_failure": False, "echo": True,
                "cwd": None}  # the course the lesson runs in (launch.course_root)
    defaults.update(options)
    if not defaults["echo"]:
        for host, command, *when in runs:
            if not when:
                print(f"{host}$ {shlex.join(command)}" + (" &" if len(runs) > 1 else ""),
                      flush=True)
    return launcher._launch(build, script, [], defaults["timeout"], defaults["out"],
                            defaults["expect_failure"], defaults["echo"], env, defaults["cwd"],
                            cues)


# ------------------------------------------------------------------------- up and down

LOCK = STATE.parent / "ddp-course-cluster.lock"
_lock = None  # the open lock file while this process owns the cluster


def _take_lock() -> bool:
    """Own the cluster: True if this process holds the lock now. The kernel releases a
    flock when its holder dies, so a cluster whose owner was killed can be taken."""
    global _lock
    if _lock is not None:
        return True
    lock = open(LOCK, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return False
    _lock = lock
    return True


def _release_lock() -> None:
    global _lock
    if _lock is not None:
        _lock.close()
        _lock = None


def up(with_slurm: bool = True) -> float:
    """Install what is missing, create the hosts and start Slurm; return the seconds it
    took. Anything left by an earlier run is removed first; if a step fails, everything
    made so far is removed before the error is raised."""
    reason = why_not()
    if reason:
        raise ClusterError(f"cannot make the cluster here: {reason}")
    start = time.monotonic()
    install()
    if not _take_lock():  # one cluster per machine: its names are fixed
        raise ClusterError(f"another process has the cluster up (it holds a lock on "
                           f"{LOCK}): wait for it to finish")
    _remove_everything()  # what an earlier run that was killed left behind
    STATE.mkdir()
    atexit.unregister(_down_at_exit)
    atexit.register(_down_at_exit)
    try:
        create_hosts()
        if with_slurm:
            start_slurm()
    except BaseException:
        down(quiet=True)
        raise
    return time.monotonic() - start


def pids_in(ns: str) -> list[int]:
    done = sh("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()]


def our_slurm_processes() -> list[int]:
    """Slurm daemons and job steps started from our configuration (their command line or
    environment names STATE), wherever they are."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() not in SLURM_PROCESSES:
                continue
            mine = f"SLURM_CONF={STATE}/".encode()
            if mine in (proc / "environ").read_bytes() or mine in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(quiet: bool = False) -> None:
    """Stop every process in the hosts, then remove the hosts, the bridge and STATE, and
    let another process make the cluster. Safe to call at any time, any number of times;
    raises if something is left."""
    try:
        _remove_everything()
    finally:
        _release_lock()
    if not quiet:
        print("[cluster] down: no namespaces, links, Slurm processes or files left",
              flush=True)


def _down_at_exit() -> None:
    """At exit, only a process that still owns the cluster removes it: another one may
    have made a cluster of its own since this one called down()."""
    if _lock is not None:
        down(quiet=True)


def _remove_everything() -> None:
    existing = set(sh("ip", "netns", "list", check=False).stdout.split())
    namespaces = [netns(h) for h in HOSTS if netns(h) in existing]
    # SIGKILL at once: nothing on the hosts has anything to save, and a kernel that stops
    # gives its exit handlers only a few seconds (Jupyter's shutdown waits 5 s, then kills).
    pids = [p for ns in namespaces for p in pids_in(ns)] + our_slurm_processes()
    _kill(pids, signal.SIGKILL)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.02)
    # A veth pair goes with its namespace, but later: the kernel cleans a namespace up in
    # the background. Deleting our end first removes both ends now.
    links = [link for link in our_links() if link != BRIDGE] + [BRIDGE]
    for link in links:
        sh("ip", "link", "del", link, check=False)
    for ns in namespaces:
        sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(STATE, ignore_errors=True)
    left = leftovers()
    if left:
        raise ClusterError("cluster teardown left: " + "; ".join(left))


def our_links() -> list[str]:
    names = [line.split(":")[1].strip().split("@")[0]
             for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines()]
    return [name for name in names if name.startswith(PREFIX)]


def down_if_up() -> bool:
    """down() if anything of ours is on this machine (a run that stopped half-way), for
    the processes that run lessons and tests; False when there was nothing to remove."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    if not leftovers() or not _take_lock():  # nothing left, or its owner is alive
        return False
    down(quiet=True)
    return True


def leftovers() -> list[str]:
    """Everything of ours still on this machine (empty when all is clean)."""
    left = []
    namespaces = [n for n in sh("ip", "netns", "list", check=False).stdout.split()
                  if n.startswith(PREFIX)]
    if namespaces:
        left.append(f"network namespaces {namespaces}")
    links = our_links()
    if links:
        left.append(f"links {links}")
    if our_slurm_processes():
        left.append(f"Slurm processes {our_slurm_processes()}")
    if STATE.exists():
        left.append(f"folder {STATE}")
    return left


def status() -> str:
    existing = [n for n in sh("ip", "netns", "list", check=False).stdout.split()
                if n.startswith(PREFIX)]
    lines = [f"namespaces: {existing or 'none'}"]
    if existing and shutil.which("sinfo"):
        lines.append(slurm("sinfo", "-N", check=False).strip())
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action",
                        choices=["install", "up", "down", "status", "leftovers", "why-not"])
    parser.add_argument("--no-slurm", action="store_true", help="up: the hosts only")
    action = parser.parse_args(argv).action
    if action == "install":
        installed = install()
        print(f"[cluster] installed {' '.join(installed)}" if installed
              else "[cluster] the packages are installed")
    elif action == "why-not":
        print(why_not() or "this machine can run the cluster")
    elif action == "up":
        seconds = up(with_slurm=not parser.parse_args(argv).no_slurm)
        atexit.unregister(_down_at_exit)  # the command line leaves it up until `down`
        print(f"[cluster] up in {seconds:.1f} s\n{status()}")
    elif action == "down":
        if not _take_lock():
            print(f"another process owns the cluster (it holds a lock on {LOCK}): stop it "
                  "first, for example by restarting the lesson's kernel", file=sys.stderr)
            return 1
        down()
    elif action == "status":
        print(status())
    elif action == "leftovers":
        left = leftovers()
        print("\n".join(left) or "nothing left")
        return 1 if left else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
