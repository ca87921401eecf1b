"""The GPU check's machinery (tools/gpu_check.py, tools/gpu_rank.py), tried on the CPU: the
launch list, how a run is judged, a real launch with the GPUs hidden, and the GPU sharing."""

import json
import os

import pytest
import torch
import torch.distributed as dist

from tools import gpu_check, gpu_rank
from tools.course import REPO


def _entry(command, returncode=0, timed_out=False):
    return json.dumps({"command": command, "returncode": returncode, "timed_out": timed_out})


def test_the_launch_list_keeps_each_scripts_first_single_node_launch_that_ended_well():
    log = [
        _entry("torchrun --standalone --nproc-per-node=2 --tee 3 ddp_scripts/10_x/a.py "
               "--steps 3", returncode=1),
        _entry("torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --tee 3 "
               "ddp_scripts/10_x/a.py"),
        _entry("torchrun --standalone --nproc-per-node=4 --max-restarts=1 --tee 3 "
               "ddp_scripts/10_x/a.py --out /tmp/tmpab12/run/a.json --device cpu"),
        _entry("torchrun --standalone --nproc-per-node=2 --tee 3 ddp_scripts/10_x/a.py"),
        _entry("torchrun --standalone --nproc-per-node=2 --tee 3 ddp_scripts/10_x/b.py",
               timed_out=True),
        _entry("python ddp_scripts/10_x/c.py"),
    ]
    launches = gpu_check.launches_from_log(log)
    assert [(x.script, x.nproc, x.max_restarts, x.args) for x in launches] == [
        ("ddp_scripts/10_x/a.py", 4, 1, ["--out", "{tmp}/run/a.json", "--device", "cpu"])]


def test_the_committed_launch_list_names_real_scripts_and_every_script_left_out():
    launches = gpu_check.read_launches()
    assert launches, "tools/gpu_launches.json is empty: run python -m tools.gpu_check --record"
    for launch in launches:
        assert (REPO / launch.script).is_file(), f"{launch.script} is gone: record again"
        assert launch.lesson == launch.script.split("/")[1]
    left_out = json.loads(gpu_check.LAUNCHES.read_text())["not_launched"]
    assert gpu_check.not_launched(launches) == left_out, (
        "a script that no launch in tools/gpu_launches.json runs is new or gone: record the "
        "list again from a course run's launch log (README, *Running on GPUs*)")


def _outcome(nproc=2, args=()):
    return gpu_check.Outcome("10_x", "ddp_scripts/10_x/a.py", list(args), nproc, "gloo")


@pytest.mark.parametrize("returncode, reports, args, status, passed", [
    (0, [{"cuda_bytes": 512}, {"cuda_bytes": 8}], (), "cuda", True),
    (0, [{"cuda_bytes": 512}, {"cuda_bytes": 0}], (), "cpu", False),
    (0, [{"cuda_bytes": 512}], (), "cpu", False),  # a rank that never reported
    (0, [{"cuda_bytes": 0}] * 2, ("--device", "cpu"), "cpu (asked for)", True),
    (1, [{"cuda_bytes": 512}] * 2, (), "failed", False),
    (None, [], (), "timed out", False),
])
def test_a_run_passes_only_if_it_ended_well_and_every_rank_used_the_gpu(
        returncode, reports, args, status, passed):
    outcome = _outcome(args=args)
    gpu_check.judge(outcome, returncode, reports)
    assert (outcome.status, outcome.passed) == (status, passed)


def test_a_real_launch_with_the_gpus_hidden_reports_each_ranks_backend(tmp_path):
    launch = gpu_check.Launch("02_devices", "ddp_scripts/02_devices/devices.py", [], 2)
    outcome = gpu_check.run(launch, 2, timeout=120, hide_gpus=True)
    assert outcome.status == "cpu" and not outcome.passed, outcome.tail
    assert [(r["rank"], r["backend"], r["cuda_bytes"]) for r in outcome.ranks] == \
        [(0, "gloo", 0), (1, "gloo", 0)]


def test_a_failing_script_is_reported_with_its_last_lines(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text('import sys\nif __name__ == "__main__":\n'
                      '    sys.exit("this rank gives up")\n')
    outcome = gpu_check.run(gpu_check.Launch("10_x", str(script), [], 1), 1, timeout=120,
                            hide_gpus=True)
    assert outcome.status == "failed" and "this rank gives up" in outcome.tail


def test_a_launch_past_its_timeout_is_killed_with_its_ranks(tmp_path):
    script = tmp_path / "sleeps.py"
    script.write_text('import time\nif __name__ == "__main__":\n    time.sleep(600)\n')
    outcome = gpu_check.run(gpu_check.Launch("10_x", str(script), [], 2), 2, timeout=15,
                            hide_gpus=True)
    assert outcome.status == "timed out" and outcome.seconds < 60


def test_two_ranks_share_one_gpu_over_gloo(monkeypatch):
    """With 2 local ranks and 1 GPU, local rank 1 gets cuda:0 (from pick_device, and as
    LOCAL_RANK for a plain script) and CUDA's default backend becomes Gloo (faked here: no
    GPU on the CPU build)."""
    import ddp_common

    monkeypatch.setattr(ddp_common, "pick_device", ddp_common.pick_device)  # restored after
    monkeypatch.setattr(dist, "get_default_backend_for_device",
                        dist.get_default_backend_for_device)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    picked = []
    monkeypatch.setattr(torch.cuda, "set_device", picked.append)
    monkeypatch.setitem(os.environ, "LOCAL_WORLD_SIZE", "2")
    monkeypatch.setitem(os.environ, "LOCAL_RANK", "1")
    assert gpu_rank.share_gpus()
    assert os.environ["LOCAL_RANK"] == "0"  # a plain script's cuda:LOCAL_RANK is cuda:0
    assert ddp_common.pick_device("auto") == torch.device("cuda", 0) == picked[0]
    assert ddp_common.pick_device("cpu") == torch.device("cpu")
    assert dist.get_default_backend_for_device(torch.device("cuda", 0)) == "gloo"
    assert dist.get_default_backend_for_device(torch.device("cpu")) == "gloo"
    monkeypatch.setitem(os.environ, "LOCAL_WORLD_SIZE", "1")
    assert not gpu_rank.share_gpus()  # one rank per GPU: nothing changes


def test_without_a_gpu_the_check_says_how_to_get_one(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the check would run")
    assert gpu_check.main([]) == 2
    assert "no GPU is visible" in capsys.readouterr().err
