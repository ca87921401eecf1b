"""Warm launches (tools/zygote.py): a process forked from the warm server is, for what a
lesson can see, the process a cold launch starts. What still differs, and why:

* its parent: a warm torchrun's workers are the children of that torchrun's own server
  (`python -m tools.zygote --workers-of PID`), not of torchrun; a plain `python SCRIPT`
  is the child of the server, not of the launching process;
* the modules the server imported are already imported (torch, numpy,
  torch.distributed.run), with what their imports did; torch._dynamo is out of sight
  until the process imports it (DDP's constructor does), and its import's variable
  (TORCHINDUCTOR_CACHE_DIR) is set then, as in a cold process, but its module is the
  server's: a script that imports torch._dynamo only after its process group exists
  behaves, warm, as one that imported it first (tests that show the difference launch
  cold), and sympy's warnings filter, which torch._dynamo adds, is already there;
* ranks reach Gloo's connection mesh together, so a script that leaves straight after
  init_process_group, with no collective, races a peer still completing its own
  connections ("Connection closed by peer") more often warm than cold (3 of 40 warm
  4-rank launches, 0 of 30 cold); the course's scripts meet in a collective first;
* /proc/PID/cmdline holds the command line as one string (as after setproctitle), and
  /proc/PID/environ ends in padding NULs;
* the hash seed of str and bytes (PYTHONHASHSEED) is the server's, shared by its children.
"""
import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

from tools import zygote
from tools.compare_launches import compare
from tools.launch import REPO, launch, launch_ranks

pytestmark = pytest.mark.skipif(not zygote.usable(), reason="warm launches are Linux only")

RANDOM = ("torch_random", "numpy_random", "python_random")
PER_RUN = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_PORT", zygote.OFF)


def tagged(result, tag: str) -> dict:
    """{rank label: the JSON the fixture printed after `tag`}."""
    found = {}
    for line in result.output.splitlines():
        if tag + " " in line:
            label, text = line.split(tag + " ", 1)
            found[label] = json.loads(text)
    return found


def warm_and_cold(run, monkeypatch):
    warm = run()
    with monkeypatch.context() as cold_only:
        cold_only.setenv(zygote.OFF, "1")
        cold = run()
    assert warm.warm and not cold.warm, (warm.warm, cold.warm, zygote.why_cold)
    return warm, cold


def without_per_run(probe: dict) -> dict:
    """A probe less what differs between any two runs, warm or cold."""
    probe = dict(probe)
    probe["environ"] = {k: v for k, v in probe["environ"].items() if k not in PER_RUN}
    probe["proc_environ"] = [v for v in probe["proc_environ"]
                             if v.split("=", 1)[0] not in PER_RUN]
    for name in (*RANDOM, "parent"):
        probe.pop(name)
    return probe


# The probe through each launcher; the plain run from another folder, by a path that
# CPython does not normalise (`__file__` keeps the `..`)
LAUNCHES = {
    "torchrun": lambda: launch("tests/fixtures/probe.py", nproc=2, timeout=90, echo=False),
    "launch_ranks": lambda: launch_ranks("tests/fixtures/probe.py", nproc=2, timeout=90,
                                         echo=False),
    "python": lambda: launch("../tests/fixtures/../fixtures/probe.py", nproc=None,
                             timeout=90, echo=False, cwd=REPO / "tools"),
}


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_warm_process_sees_what_a_cold_one_sees(how, monkeypatch):
    """For each launcher, every observable the probe reads is the same warm and cold: the
    stack, argv, paths, environment (also /proc/self/environ and cmdline), threads (torch's
    and numpy's BLAS's), streams and where torch's log handlers write, signals (SIGHUP
    ignored by the launching process stays ignored in a plain run, as exec keeps it),
    fds, session, umask; and each process draws its own random numbers."""
    monkeypatch.setattr(signal, "SIGHUP", signal.SIGHUP)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        runs = warm_and_cold(LAUNCHES[how], monkeypatch)
        again = LAUNCHES[how]()  # another warm one, for the random numbers
    finally:
        signal.signal(signal.SIGHUP, previous)
    warm, cold, again = (tagged(r, "PROBE") for r in (*runs, again))
    assert sorted(warm) == sorted(cold) and len(warm) == (1 if how == "python" else 2)
    for label in warm:
        w, c = without_per_run(warm[label]), without_per_run(cold[label])
        different = {k: (w[k], c[k]) for k in w if w[k] != c[k]}
        assert not different, f"{label}: warm and cold differ in {different}"
        # What the comparison covers, spelled out for the warm run
        assert w["stack"] == ["<module> (probe.py)"]
        assert w["threads"] == ["MainThread"] and w["main_thread"]
        assert w["torch_threads"] == c["torch_threads"] and w["blas_threads"] == c["blas_threads"]
        if how == "torchrun":  # torchrun's OMP_NUM_THREADS=1, for torch and numpy's BLAS
            assert w["torch_threads"] == 1 and set(w["blas_threads"]) == {1}
        assert w["log_streams"] == [True]
        assert not w["cuda_initialized"] and w["session_leader"]
        assert w["fds"] == [0, 1, 2, 3]  # its three streams, and the listing's own
        # torchrun sets its own SIGHUP handler in the agent; its workers start with the default
        assert w["signals"]["SIGHUP"] == ("SIG_IGN" if how != "torchrun" else "SIG_DFL")
        if how == "python":
            assert w["file"].endswith("/tests/fixtures/../fixtures/probe.py")
    # Warm really was warm: the parent is a warm server, not torchrun or this process
    for label in warm:
        assert "-m tools.zygote" in warm[label]["parent"], warm[label]["parent"]
        assert "-m tools.zygote" not in cold[label]["parent"], cold[label]["parent"]
    # Each process draws its own random numbers, warm as cold (a fork would share the
    # server's): ranks differ from each other, and a launch from the one before
    for key in RANDOM:
        draws = [probe[key] for probe in [*warm.values(), *again.values()]]
        assert len(set(draws)) == len(draws), (key, draws)


def test_variables_read_when_used_reach_a_warm_worker(monkeypatch):
    """The variables a launch may set and still be warm (zygote.READ_WHEN_USED) do to a
    warm worker what they do to a cold one."""
    def seen(env):
        return warm_and_cold(lambda: launch("tests/fixtures/when_used.py", nproc=2,
                                            timeout=90, echo=False, env=env), monkeypatch)

    default_warm, default_cold = (tagged(r, "WHEN_USED") for r in seen({}))
    assert default_warm == default_cold
    assert default_warm["[default0]:"]["recorded"] > 2  # the 3 all-reduces and the join
    assert default_warm["[default0]:"]["loaded"] == "refused"  # weights_only=True
    changed = {"TORCH_FR_BUFFER_SIZE": "2", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "CUDA_VISIBLE_DEVICES": "",
               "TORCH_FR_DUMP_TEMP_FILE": str(Path(tempfile.gettempdir()) / "unused_")}
    warm, cold = (tagged(r, "WHEN_USED") for r in seen(changed))
    assert warm == cold
    for rank in warm.values():
        assert rank["recorded"] == 2 and rank["loaded"] == "NotATensor"
        assert rank["agent_store"] == "False" and rank["gpus"] == 0
    # GLOO_SOCKET_IFNAME: an interface that does not exist stops both alike
    bad = {"GLOO_SOCKET_IFNAME": "nosuch0"}
    failed = warm_and_cold(lambda: launch("tests/fixtures/when_used.py", "--gloo-only",
                                          nproc=2, timeout=90, echo=False, env=bad,
                                          expect_failure=True), monkeypatch)
    for result in failed:
        assert result.returncode == 1 and "nosuch0" in result.output


def test_a_variable_read_at_start_up_gets_a_cold_worker():
    """TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported: a launch that
    sets it is cold, and its ranks see it."""
    result = launch("tests/fixtures/when_used.py", nproc=2, timeout=90, echo=False,
                    env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert not result.warm
    assert tagged(result, "WHEN_USED")["[default0]:"]["debug"] == "DebugLevel.DETAIL"


def test_the_start_up_variables_are_what_the_servers_imports_look_up():
    """What sends a launch cold is measured (zygote.startup_variables: every getenv and
    os.environ lookup while importing zygote.PRELOAD): the variables torch reads at
    import are in it, and none of those a warm worker may see changed (READ_WHEN_USED)."""
    names = zygote.startup_variables()
    assert {"TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "OMP_NUM_THREADS"} <= names
    assert not names & set(zygote.READ_WHEN_USED), names & set(zygote.READ_WHEN_USED)


def test_a_variable_nothing_reads_at_start_up_keeps_launches_warm(monkeypatch):
    """scikit-learn's import sets KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK (Intel
    OpenMP's) in the process that imports it; this torch loads GNU OpenMP, which never
    looks them up: a launch from that process stays warm, as from a clean one."""
    assert not {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"} & zygote.startup_variables()
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "True")
    monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")
    result = launch("tests/fixtures/ok.py", nproc=2, timeout=90, echo=False)
    assert result.warm, zygote.why_cold


ENDINGS = ["exit3", "raise", "os_exit", "sigkill", "atexit", "open_file", "keyboard"]


@pytest.mark.parametrize("how", ENDINGS)
def test_a_warm_process_ends_as_python_ends(how, tmp_path, monkeypatch):
    """Exit statuses, tracebacks, atexit, and a file left open (flushed when the
    interpreter finalizes): warm as cold."""
    def run():
        target = tmp_path / f"left-open-{len(list(tmp_path.iterdir()))}"
        result = launch("tests/fixtures/endings.py", how, target, nproc=None, timeout=60,
                        echo=False, expect_failure=how not in ("atexit", "open_file"))
        return result, target.read_text() if target.exists() else None

    (warm, warm_file), (cold, cold_file) = warm_and_cold_pair(run, monkeypatch)
    assert (warm.returncode, warm.output, warm_file) == (cold.returncode, cold.output,
                                                         cold_file)
    expected = {"exit3": 3, "raise": 1, "os_exit": 5, "sigkill": -9, "atexit": 0,
                "open_file": 0, "keyboard": -2}[how]
    assert warm.returncode == expected
    if how == "raise":
        assert warm.output.startswith("Traceback (most recent call last):\n  File \"")
    if how == "open_file":
        assert warm_file == "written, never closed"


def warm_and_cold_pair(run, monkeypatch):
    warm = run()
    with monkeypatch.context() as cold_only:
        cold_only.setenv(zygote.OFF, "1")
        cold = run()
    assert warm[0].warm and not cold[0].warm, (warm[0].warm, cold[0].warm, zygote.why_cold)
    return warm, cold


def test_lessons_that_kill_restart_and_hang_launch_alike_warm_and_cold(tmp_path):
    """Lesson 23 (a killed rank, torchrun's restarts, the dead processes' keys in its
    store, an error file read while it is written) and lesson 25 (hangs: timeouts, py-spy
    stacks of the ranks, the flight recorder, pdb on one rank), each run with warm launches
    and with cold ones: every launch alike, less what depends on timing
    (tools/compare_launches.py; the whole course: `python -m tools.compare_launches`)."""
    paths = [REPO / "notebooks" / f"{stem}.ipynb"
             for stem in ("23_fault_tolerance", "25_debugging")]
    found = compare(paths, tmp_path)
    assert all(not diffs for diffs, _ in found.values()), "\n".join(
        f"{stem}:\n" + "\n".join(diffs) for stem, (diffs, _) in found.items() if diffs)
    assert not [notes for _, notes in found.values() if notes]  # and every launch was warm


KERNEL_PROBE = """\
import json, os, random, signal, sys, threading
import torch
main = sys.modules["__main__"]
print("KERNEL " + json.dumps({
    "argv": sys.argv, "executable": sys.executable, "path": sys.path, "cwd": os.getcwd(),
    "environ": {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME",)},
    "main": sorted(k for k in vars(main) if k.startswith("__")), "flags": list(sys.flags),
    "threads": sorted(t.name for t in threading.enumerate()),
    "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_initialized(),
    "sigint": str(signal.getsignal(signal.SIGINT)), "session": os.getsid(0) == os.getpid(),
    "parent": open(f"/proc/{os.getppid()}/cmdline").read().replace(chr(0), " "),
    "random": [torch.rand(1).item(), random.random()]}))
"""


def test_a_warm_kernel_sees_what_a_cold_one_sees(tmp_path, workspace, monkeypatch):
    """The lessons' kernels under papermill (tools/warm_kernel.py): forked from a server
    that has imported torch and ipykernel's machinery, each is the kernel jupyter_client
    would have started. Two warm kernels draw their own random numbers."""
    import nbformat

    from tools.course import execute

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("world_size = 2", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(KERNEL_PROBE)]

    def probe(name):
        execute(nb, tmp_path / f"{name}.ipynb", workspace)
        text = "".join(o.get("text", "") for o in
                       nbformat.read(tmp_path / f"{name}.ipynb", 4).cells[1].outputs)
        return json.loads(text.split("KERNEL ", 1)[1])

    warm, again = probe("warm"), probe("again")
    with monkeypatch.context() as cold_only:
        cold_only.setenv(zygote.OFF, "1")
        cold = probe("cold")
    assert "-m tools.zygote" in warm["parent"] and "-m tools.zygote" not in cold["parent"]
    assert warm["random"] != again["random"]
    for probed in (warm, cold):
        for name in ("parent", "random"):
            probed.pop(name)
        probed["environ"].pop(zygote.OFF, None)
        probed["argv"][2] = os.path.basename(probed["argv"][2])  # each run's own folder
    assert warm == cold, {k: (warm[k], cold[k]) for k in warm if warm[k] != cold[k]}


def test_pdbs_prompt_is_compared_wherever_it_landed():
    """pdb's prompt has no newline: a cold run printed `(Pdb) > file(3)main()` where a warm
    one printed the prompt on a line of its own (CI, 2026-11-29); both read alike."""
    from tools.compare_launches import shape

    def run(output):
        return shape({"output": output, "command": "torchrun x.py", "returncode": 0,
                      "timed_out": False, "data": None})

    assert run("[default0]:(Pdb) > /tmp/a.py(3)main()\n") == run(
        "[default0]:(Pdb) \n[default0]:> /tmp/a.py(3)main()\n")
    assert run("[default0]:(Pdb) [default1]:rank 1 waits\n") == run(
        "[default1]:rank 1 waits\n[default0]:(Pdb) \n")
