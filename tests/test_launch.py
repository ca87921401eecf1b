"""The launcher: streaming, failures, timeouts that kill the whole tree (after taking each
rank's stack), no fixed port."""
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tools.launch import (
    KILL_GRACE_S,
    REPO,
    STACKS_LIMIT_S,
    LaunchError,
    LaunchTimeout,
    _launch,
    _Process,
    course_root,
    launch,
    launch_nodes,
    launch_ranks,
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie has already died
    except FileNotFoundError:
        return False


def test_success_prints_command_streams_ranks_and_returns_json(capsys):
    result = launch("tests/fixtures/ok.py", nproc=2, out=True, timeout=60)
    printed = capsys.readouterr().out
    assert printed.startswith("$ torchrun --standalone --nproc-per-node=2 --tee 3 "
                              "tests/fixtures/ok.py --out ")
    assert "[default0]:ok first line from rank 0" in printed
    assert "[default1]:ok second line from rank 1" in printed
    assert result.ok and result.returncode == 0
    assert result.rank_lines(1) == ["ok first line from rank 1", "ok second line from rank 1"]
    assert result.data["rank"] == "0" and result.data["world_size"] == "2"
    assert int(result.data["master_port"]) > 0


def test_failure_raises_with_the_scripts_error():
    with pytest.raises(LaunchError) as caught:
        launch("tests/fixtures/fail.py", nproc=2, timeout=60, echo=False)
    message = str(caught.value)
    assert "failed with exit status 1" in message  # torchrun's status
    assert "rank 1 gives up: no data" in message  # the script's own words
    assert "Root Cause (first observed failure)" in message  # torchrun's report
    assert "_run_module_as_main" not in message  # but not torchrun's own traceback
    assert not isinstance(caught.value, LaunchTimeout)
    assert caught.value.result.returncode == 1


def test_a_rank_still_printing_does_not_push_the_error_out_of_the_message(tmp_path):
    """Rank 1 fails; only then does rank 0 print 60 lines. The message still shows rank
    1's error (it once showed only the last 20 lines of all ranks together)."""
    flag = tmp_path / "rank1-said-it"
    script = tmp_path / "chatter.py"
    script.write_text(
        "import os, sys, time\n"
        f"flag = {str(flag)!r}\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('rank 1 gives up: no data', file=sys.stderr, flush=True)\n"
        "    open(flag, 'w').close()\n"
        "    time.sleep(2)\n"
        "    sys.exit(3)\n"
        "while not os.path.exists(flag):\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0.5)\n"
        "for i in range(60):\n"
        "    print(f'rank 0 still working, step {i}', flush=True)\n")
    with pytest.raises(LaunchError) as caught:
        launch(str(script), nproc=2, timeout=60, echo=False)
    assert "rank 1 gives up: no data" in str(caught.value)
    assert "rank 0 still working, step 59" in str(caught.value)


def test_expected_failure_returns_the_output():
    result = launch("tests/fixtures/fail.py", nproc=2, timeout=60, expect_failure=True,
                    echo=False)
    assert result.returncode == 1 and "rank 1 gives up" in result.output
    assert "exitcode  : 3" in result.output  # torchrun's report of the failing rank


def test_expected_failure_that_succeeds_is_an_error():
    with pytest.raises(LaunchError, match="expected to fail but exited 0"):
        launch("tests/fixtures/ok.py", nproc=1, timeout=60, expect_failure=True, echo=False)


@pytest.mark.parametrize("torchrun", ["warm", "cold"])
def test_timeout_kills_torchrun_the_workers_and_their_children(torchrun, tmp_path,
                                                                 monkeypatch, warm_starts):
    if torchrun == "cold":
        monkeypatch.setenv("DDP_COURSE_COLD_LAUNCH", "1")
    timeout = 20
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as caught:
        launch("tests/fixtures/hang.py", nproc=2, timeout=timeout, echo=False,
               env={"HANG_PID_DIR": str(tmp_path)})
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + STACKS_LIMIT_S + KILL_GRACE_S + 10
    assert f"did not finish within {timeout} s" in str(caught.value)
    assert "is waiting forever" in str(caught.value)  # output before the kill is kept
    pids = [int(p) for f in sorted(tmp_path.iterdir()) for p in f.read_text().split()]
    assert len(pids) == 4, "both ranks should have started and recorded two pids"
    for rank_pid in pids[0::2]:  # where each rank was: py-spy's stack, at the script's loop
        stack = str(caught.value).split(f"[launch] stack of process {rank_pid}:\n")[1]
        assert re.match(r"Process \d+: .*hang\.py\n(.*\n)*? +<module> \(hang\.py:1[45]\)",
                        stack), stack[:400]
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes survived the timeout"
    assert len(warm_starts) == (torchrun == "warm" and sys.platform == "linux")


def test_plain_python_launch_hides_launcher_variables(monkeypatch):
    monkeypatch.setenv("RANK", "7")  # as if the caller itself ran under torchrun
    result = launch("tests/fixtures/ok.py", nproc=None, out=True, timeout=60, echo=False)
    assert result.command.startswith("python tests/fixtures/ok.py --out ")
    assert result.data["rank"] is None and result.data["world_size"] is None


def test_parallel_launches_get_different_ports():
    results = {}

    def run(tag):
        results[tag] = launch("tests/fixtures/ok.py", "--tag", tag, nproc=2, out=True,
                              timeout=90, echo=False)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["a", "b"]
    assert results["a"].data["tag"] == "a" and results["b"].data["tag"] == "b"
    assert results["a"].data["master_port"] != results["b"].data["master_port"]


def test_missing_results_file_is_an_error():
    with pytest.raises(LaunchError, match="wrote no results"):
        launch("tests/fixtures/no_json.py", nproc=1, out=True, timeout=60, echo=False)


def test_a_lesson_in_a_copy_of_the_course_launches_the_copys_scripts(tmp_path, monkeypatch):
    """A lesson's kernel works in its course's notebooks/ folder; `make course`, the tests and
    the grader run lessons in copies, and a launch there runs the script the copy's lesson
    just wrote, though `tools` is imported from this checkout."""
    copy = tmp_path / "copy"
    (copy / "notebooks").mkdir(parents=True)
    (copy / "ddp_scripts" / "00_x").mkdir(parents=True)
    (copy / "ddp_scripts" / "00_x" / "hello.py").write_text("print(\"the copy's\")\n")
    monkeypatch.chdir(tmp_path / "copy" / "notebooks")
    assert course_root() == tmp_path / "copy"
    result = launch("ddp_scripts/00_x/hello.py", nproc=None, timeout=60, echo=False)
    assert "the copy's" in result.output
    monkeypatch.chdir(tmp_path)  # no course here: this checkout's
    assert course_root() == REPO


def test_missing_script_is_reported_before_launching():
    with pytest.raises(FileNotFoundError, match="no script at"):
        launch("ddp_scripts/does_not_exist.py", echo=False)


def test_environment_is_passed_to_the_ranks(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    marker = tmp_path / "seen"
    script = tmp_path / "env.py"
    script.write_text("import os\n"
                      "open(os.environ['MARKER'], 'w').write(os.environ['OMP_NUM_THREADS'])\n")
    launch(str(script), nproc=2, timeout=60, echo=False, cwd="/",
           env={"MARKER": str(marker)})
    assert marker.read_text() == "1"  # torchrun's default when it starts several workers
    assert os.environ.get("MARKER") is None


def test_launch_ranks_sets_rank_variables_and_prefixes_lines(capsys):
    result = launch_ranks("tests/fixtures/ok.py", nproc=3, out=True, timeout=60)
    printed = capsys.readouterr().out
    assert "$ RANK=2 LOCAL_RANK=2 WORLD_SIZE=3 python tests/fixtures/ok.py --out " in printed
    assert result.rank_lines(2) == ["ok first line from rank 2", "ok second line from rank 2"]
    assert result.data["rank"] == "0" and result.data["world_size"] == "3"
    assert result.data["master_port"] is None  # no launcher meeting point: the script's job


def test_launch_ranks_can_start_fewer_processes_than_the_world():
    result = launch_ranks("tests/fixtures/ok.py", nproc=1, world_size=4, out=True,
                          timeout=60, echo=False)
    assert result.data["world_size"] == "4" and result.rank_lines(0)


def test_launch_ranks_stops_the_others_when_one_fails():
    start = time.monotonic()
    result = launch_ranks("tests/fixtures/one_fails.py", nproc=3, timeout=60, echo=False,
                          expect_failure=True)
    assert time.monotonic() - start < 20  # not the 60 s timeout: the others were stopped
    assert not result.timed_out and result.returncode == 3
    assert "[rank1]:rank 1 fails at once" in result.output


PARTS = """import sys, time
role, log = sys.argv[1], sys.argv[2]
if role == "dies":
    sys.exit(3)
if role == "waits":
    time.sleep(1.0)
open(log, "a").write(role + "\\n")
print("done", role)
"""


@pytest.mark.parametrize("on_its_own", [True, False])
def test_processes_on_their_own_and_one_that_starts_later(tmp_path, on_its_own):
    """An elastic job's hosts (lesson 26): with `on_its_own`, a process that fails does
    not stop the others; one with `start_when` starts once that holds (a host that comes
    back), and the output says when; `exit_codes` says how each ended. Without
    `on_its_own`, the failure stops the others, and what waits never starts."""
    script, log = tmp_path / "parts.py", tmp_path / "log"
    script.write_text(PARTS)

    def build(args):
        def part(role, when=None):
            return _Process(role, ["python", "parts.py", role],
                            [sys.executable, str(script), role, str(log)], {},
                            on_its_own=on_its_own, start_when=when)
        return [part("dies"), part("waits"),
                part("later", lambda: log.exists() and "waits" in log.read_text())]

    result = _launch(build, str(script), [], 60, False, True, False, None, tmp_path)
    assert result.returncode == 3 and not result.timed_out
    if on_its_own:
        assert result.exit_codes == [3, 0, 0]
        assert log.read_text().splitlines() == ["waits", "later"]  # later: after waits
        assert "[launch] started now: here$ python parts.py later" in result.output
        assert "[later]:done later" in result.output
    else:
        assert result.exit_codes[0] == 3 and result.exit_codes[2] is None
        assert not log.exists()
        assert "started now" not in result.output


def test_launch_nodes_forms_one_job_from_two_agents():
    result = launch_nodes("tests/fixtures/ok.py", nnodes=2, nproc=1, out=True, timeout=90,
                          echo=False)
    assert "--rdzv-backend=c10d" in result.command and result.command.count("torchrun") == 2
    assert result.data["world_size"] == "2"
    assert "[node0] [default0]:ok first line" in result.output
    assert "[node1] [default0]:ok first line" in result.output


def test_gpu_check_agrees_with_torch_and_spares_the_kernel_importing_it():
    """`cpu_unless_enough_gpus` runs in every lesson's kernel; where no GPU device file
    exists it answers without importing torch (about 2 s), and its answer must be the one
    torch gives."""
    code = ("import sys; from tools.launch import cpu_unless_enough_gpus, no_gpu_possible; "
            "print(no_gpu_possible(), cpu_unless_enough_gpus(64) == {}, "
            "'torch' in sys.modules)")
    fast, empty, imported = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
        check=True, timeout=120).stdout.split()
    import torch

    gpus = torch.cuda.device_count()
    if fast == "True":
        assert gpus == 0  # the short answer is only given where torch would count none
    if sys.platform == "linux" and not any(
            name.startswith(("nvidia", "dxg", "kfd")) for name in os.listdir("/dev")):
        assert fast == "True"  # no GPU device file at all (CI, most laptops): no import
    assert empty == str(gpus == 0)  # 64 processes: hidden unless there are no GPUs at all
    assert imported == str(fast == "False")  # torch is imported only when it must count


def test_a_ranks_error_on_stderr_is_in_the_message_even_when_its_stdout_came_later():
    """In CI, torchrun once printed a rank's error before that rank's earlier stdout lines
    (its two streams are copied by two threads), and the message's last lines per rank
    missed it. The message also shows each rank's stderr from torchrun's log files."""
    with pytest.raises(LaunchError) as caught:
        launch("tests/fixtures/error_then_chatter.py", nproc=2, timeout=60, echo=False)
    message = str(caught.value)
    assert "rank 1: the data file is missing" in message
    assert caught.value.result.stderr_by_rank[1].strip() == "rank 1: the data file is missing"
    assert "ddp-course-logs-" not in message  # torchrun's log folder stays out of sight


# The warm torchrun (tools/zygote.py): the same torchrun, forked from a server that has
# already imported torch, for launches whose environment starts Python and torch alike.

@pytest.fixture
def warm_starts(monkeypatch):
    """The warm torchruns started during a test."""
    from tools import zygote

    started = []
    original = zygote.start

    def spy(*args, **kwargs):
        process = original(*args, **kwargs)
        if process is not None:
            started.append(process)
        return process

    monkeypatch.setattr(zygote, "start", spy)
    return started


@pytest.mark.skipif(sys.platform != "linux", reason="the warm torchrun is Linux only")
def test_warm_and_cold_torchrun_print_the_same_and_fail_alike(warm_starts, monkeypatch):
    warm = launch("tests/fixtures/fail.py", nproc=2, timeout=60, echo=False,
                  expect_failure=True)
    assert len(warm_starts) == 1
    monkeypatch.setenv("DDP_COURSE_COLD_LAUNCH", "1")
    cold = launch("tests/fixtures/fail.py", nproc=2, timeout=60, echo=False,
                  expect_failure=True)
    assert len(warm_starts) == 1, "DDP_COURSE_COLD_LAUNCH=1 should start a new torchrun"
    assert warm.returncode == cold.returncode == 1
    # Rank 1's lines, in any order (torchrun copies a rank's stdout and stderr in two
    # threads); rank 0 may be stopped mid-way once rank 1 has failed.
    assert sorted(warm.rank_lines(1)) == sorted(cold.rank_lines(1)), (
        f"warm:\n{warm.output[-2500:]}\ncold:\n{cold.output[-2500:]}")  # seen once, loaded
    for result in (warm, cold):
        assert "exitcode  : 3" in result.output and "rank 1 gives up: no data" in \
            result.stderr_by_rank[1]
    # torchrun's traceback and its report match too, less times and process ids and the
    # frames of `python -m` (runpy) that start the cold one's traceback. (Its log lines
    # depend on timing: rank 0 may still be running when rank 1 fails, and is then stopped.)
    def own(result):
        lines = result.output.splitlines()
        start = lines.index("Traceback (most recent call last):")
        end = next(i for i, line in enumerate(lines) if "ChildFailedError:" in line)
        root = next(i for i, line in enumerate(lines) if line.startswith("Root Cause"))
        return ([line for line in lines[start:end + 1] if "<frozen runpy>" not in line]
                + [re.sub(r"\d", "0", line) for line in lines[root:]])
    assert own(warm) == own(cold)


@pytest.mark.skipif(sys.platform != "linux", reason="the warm torchrun is Linux only")
def test_a_launch_setting_a_start_up_variable_gets_a_cold_torchrun(warm_starts, tmp_path):
    result = launch("tests/fixtures/ok.py", nproc=2, timeout=60, echo=False,
                    env={"TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert not warm_starts
    # the variable is part of the command a learner types, and shown as such
    assert result.command.startswith("TORCH_CPP_LOG_LEVEL=ERROR torchrun --standalone"), \
        result.command
    launch("tests/fixtures/ok.py", nproc=2, timeout=60, echo=False,
           env={"SOMETHING_ELSE": "1"})
    assert len(warm_starts) == 1


@pytest.mark.skipif(sys.platform != "linux", reason="the warm torchrun is Linux only")
def test_the_warm_server_leaves_with_the_process_that_started_it(tmp_path):
    code = ("import os, sys; sys.path.insert(0, sys.argv[1])\n"
            "from tools import launch, zygote\n"
            "launch.launch('tests/fixtures/ok.py', nproc=2, timeout=60, echo=False)\n"
            "print(zygote._server.proc.pid, zygote._server.folder, flush=True)\n"
            "os._exit(0)  # no atexit: as a kernel that was killed\n")
    from tools import zygote

    own = {k: v for k, v in os.environ.items() if k != zygote.SHARED}  # its own server
    printed = subprocess.run([sys.executable, "-c", code, str(REPO)], cwd=REPO, check=True,
                             capture_output=True, text=True, timeout=60, env=own).stdout.split()
    pid, folder = int(printed[0]), printed[1]
    deadline = time.monotonic() + 5
    while (alive(pid) or os.path.exists(folder)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid) and not os.path.exists(folder)


def test_one_setting_gives_every_launch_more_time(tmp_path, monkeypatch):
    """DDP_COURSE_TIMEOUT_SCALE=10: a run of about 2 s under a written timeout of 1 s ends
    well (10 s); unset, the same launch is killed at 1 s and the message names the setting;
    a value that is not a factor of 1 or more is refused with what to write."""
    script = tmp_path / "two_seconds.py"
    script.write_text('import time\nif __name__ == "__main__":\n    time.sleep(2)\n'
                      '    print("done")\n')
    monkeypatch.setenv("DDP_COURSE_TIMEOUT_SCALE", "10")
    assert launch(str(script), nproc=None, timeout=1, echo=False).ok
    monkeypatch.delenv("DDP_COURSE_TIMEOUT_SCALE")
    with pytest.raises(LaunchTimeout, match="DDP_COURSE_TIMEOUT_SCALE=2"):
        launch(str(script), nproc=None, timeout=1, echo=False)
    for wrong in ("fast", "0.5"):
        monkeypatch.setenv("DDP_COURSE_TIMEOUT_SCALE", wrong)
        with pytest.raises(ValueError, match="DDP_COURSE_TIMEOUT_SCALE"):
            launch(str(script), nproc=None, timeout=1, echo=False)
