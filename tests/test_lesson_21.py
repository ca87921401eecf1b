"""Lesson 21's claims about PyTorch that its own run (world size 2) cannot show: they need
more ranks, or they kill the job. Each test writes a small script and runs it under torchrun."""
import json
import re
import textwrap

from tools.launch import launch

MONITORED_BARRIER = textwrap.dedent('''
    import json
    import time
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    NEVER = None
    ROUNDS = [  # (wait_all_ranks, arrival of ranks 1, 2, 3 in s; None: after rank 0 gave up)
        (True, [0.5, 1.3, NEVER]),
        (False, [0.5, 1.3, NEVER]),
        (True, [0.0, NEVER, NEVER]),
    ]
    TIMEOUT = 1.0
    for wait_all_ranks, arrivals in ROUNDS:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=5))
        dist.barrier()
        if rank > 0:
            late = arrivals[rank - 1]
            time.sleep(late if late is not None else 3.5)
        start = time.perf_counter()
        try:
            dist.monitored_barrier(group=group, timeout=timedelta(seconds=TIMEOUT),
                                   wait_all_ranks=wait_all_ranks)
            error = None
        except RuntimeError as failure:
            error = str(failure).splitlines()[0]
        if rank == 0:
            print("RESULT " + json.dumps({"wait_all_ranks": wait_all_ranks, "error": error,
                                          "seconds": time.perf_counter() - start}), flush=True)
        dist.barrier()
    dist.destroy_process_group()
''')


def test_monitored_barrier_gives_each_missing_rank_a_full_timeout(tmp_path):
    """Lesson 21, section 3: with wait_all_ranks=True rank 0 waits for the ranks in turn,
    each with the whole timeout (up to (N-1) x timeout in all); with False, one timeout."""
    script = tmp_path / "monitored_barrier.py"
    script.write_text(MONITORED_BARRIER)
    run = launch(script, nproc=4, timeout=120, echo=False)
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in run.rank_lines(0)
             if line.startswith("RESULT ")]
    timeout = 1.0
    each, first_only, two_missing = found
    # rank 2 came 1.3 s late, more than the timeout, and passed: its wait began when
    # rank 1 arrived (0.5 s). Rank 3's wait began at 1.3 s and ended a timeout later.
    assert re.fullmatch(r"\[Rank 0\]: Ranks 3 failed to pass monitoredBarrier in 1000 ms",
                        each["error"]), each
    assert 2 * timeout < each["seconds"] < 3 * timeout + 0.5, each
    # the default stops at the first missing rank, within one timeout
    assert re.match(r"\[Rank 0\]: Rank 2 failed to pass monitoredBarrier in 1000 ms",
                    first_only["error"]), first_only
    assert timeout <= first_only["seconds"] < timeout + 0.5, first_only
    # two ranks that never come: both named after one timeout, not two (on Gloo, the
    # first timeout breaks rank 0's connections, and the wait for rank 3 fails at once)
    assert re.fullmatch(r"\[Rank 0\]: Ranks 2, 3 failed to pass monitoredBarrier in 1000 ms",
                        two_missing["error"]), two_missing
    assert timeout <= two_missing["seconds"] < 1.5 * timeout, two_missing


USER_COLLECTIVE_ON_THE_DDP_GROUP = textwrap.dedent('''
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).double())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    with Join([ddp]):
        for step in range(6 if rank == 0 else 4):
            x = torch.randn(16, 32, dtype=torch.float64)
            optimizer.zero_grad()
            loss = F.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            optimizer.step()
            dist.all_reduce(loss.detach())  # a metric, on the default group, like DDP
            print(f"rank {rank}: step {step} done", flush=True)
    print(f"rank {rank}: left the Join block", flush=True)
    dist.destroy_process_group()
''')


def test_join_with_a_user_collective_on_the_ddp_group_breaks_the_job(tmp_path):
    """Lesson 21, section 4: on the DDP model's own group, the metric's all-reduce pairs
    up with Join's count on the joined rank. Here (a float64 metric against Join's float32
    count) Gloo aborts the joined rank on the size mismatch, which no except can catch; a
    metric of the count's size can pair up unnoticed and fail later, with an abort or a
    timeout. Either way the job never finishes."""
    script = tmp_path / "join_metric_same_group.py"
    script.write_text(USER_COLLECTIVE_ON_THE_DDP_GROUP)
    run = launch(script, nproc=2, timeout=120, echo=False, expect_failure=True)
    assert "rank 1: step 3 done" in run.output  # the even part trained fine
    assert "rank 0: step 5 done" not in run.output  # rank 0 never finished its batches
    assert "left the Join block" not in run.output
    assert ("Is there a distributed collective mismatch in your code?" in run.output
            or "Timed out waiting" in run.output), run.summary()


# The lesson's scripts at 3 ranks with a straggler in the middle, and their failures
# (moved here from test_scripts.py when the lesson's one script became five).

def per_key(data):
    return {key: [r[key] for r in data["ranks"]] for key in data["ranks"][0]}


def test_straggler_on_three_ranks_with_a_middle_straggler():
    data = launch("ddp_scripts/21_skewed_speeds/straggler.py", "--slow-rank", "1", "--steps", "6",
                  nproc=3, out=True, timeout=120, echo=False).data
    waits = [sum(s["end"] - s["ready"] for s in steps) for steps in per_key(data)["timeline"]]
    assert waits.index(min(waits)) == 1  # the straggler is the one rank that hardly waits


def test_diagnosis_on_three_ranks_with_a_middle_straggler():
    data = per_key(launch("ddp_scripts/21_skewed_speeds/diagnosis.py", "--slow-rank", "1", nproc=3,
                          out=True, timeout=120, echo=False).data)
    named = re.search(r"Ranks ([\d, ]+) failed to pass monitoredBarrier",
                      data["monitored_barrier"][0]["error"])
    assert named and "1" in named.group(1).replace(" ", "").split(",")
    assert all("Detected mismatch" in o["error"] for o in data["mismatch_detail"])


def test_uneven_inputs_and_join_on_three_ranks():
    data = per_key(launch("ddp_scripts/21_skewed_speeds/uneven.py", "--batches", "5", "3", nproc=3,
                          out=True, timeout=120, echo=False).data)
    assert [o["steps_done"] for o in data["uneven"]] == [3, 3, 3]
    for key, divided in [("join", True), ("join_no_divide", False)]:
        extra = data[key][0]["extra_steps"]
        assert [s["step"] for s in extra] == [3, 4]
        assert all(s["equals_own_gradient_over_world_size"] == divided for s in extra)
        first, *others = data[key]  # weights broadcast at Join's exit, momentum left apart
        assert [o["optimizer_steps"] for o in data[key]] == [5, 3, 3]
        assert all(o["weights_after"] == first["weights_after"] != o["weights_own"]
                   for o in others)
        assert all(o["momentum_after"] != first["momentum_after"] for o in others)


def test_join_limits_on_three_ranks():
    data = per_key(launch("ddp_scripts/21_skewed_speeds/join_limits.py", "--batches", "5", "3",
                          nproc=3,
                          out=True, timeout=120, echo=False).data)
    for counts in data["join_costs"]:
        assert [counts[k]["per_forward"][0] for k in counts] == [0, 2, 3, 3]
    hung = data["join_metric"]
    assert hung[0]["where"] == "metric" and "Timed out" in hung[0]["error"]
    assert [o["where"] for o in hung[1:]] == ["joined", "joined"]
    thrown = data["join_metric_throw"]
    assert [o["steps"] for o in thrown] == [3, 3, 3]
    assert [o["error"] for o in thrown[1:]] == [f"RuntimeError: Rank {r} exhausted all inputs."
                                                for r in (1, 2)]
    assert len({(o["weights"], o["momentum"]) for o in thrown}) == 1


def test_stall_fails_the_job_after_the_timeout():
    result = launch("ddp_scripts/21_skewed_speeds/stall.py", "--stall-at", "1", "--stall-timeout",
                    "2",
                    nproc=2, out=True, timeout=120, echo=False, expect_failure=True)
    stall = result.data["stall"]  # rank 0 wrote it before it failed
    assert stall["step"] == 1 and 2 <= stall["waited"] < 4
    assert "rank 1: stalling at step 1" in result.output
    root_cause = result.output.split("Root Cause (first observed failure)")[1]
    assert "traceback : Traceback (most recent call last)" in root_cause  # @record on main


def test_straggler_refuses_rank_0_as_the_slow_rank():
    result = launch("ddp_scripts/21_skewed_speeds/straggler.py", "--slow-rank", "0", nproc=2,
                    timeout=120, echo=False, expect_failure=True)
    assert "--slow-rank must be between 1 and 1" in result.output
