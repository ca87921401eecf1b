"""Each companion script run under torchrun with its defaults, asserted on its JSON."""

import torch
import torch.distributed

from tools.launch import launch, launch_ranks


def test_hello_ranks_with_three_processes():
    data = launch("ddp_scripts/01_how_the_course_works/hello_ranks.py", nproc=3, out=True,
                  timeout=120,
                  echo=False).data
    assert data["world_size"] == 3
    ranks = data["ranks"]
    assert [int(r["RANK"]) for r in ranks] == [0, 1, 2]  # all_gather_object keeps rank order
    assert {r["LOCAL_WORLD_SIZE"] for r in ranks} == {"3"}
    assert len({r["MASTER_PORT"] for r in ranks}) == 1
    assert len({r["pid"] for r in ranks}) == 3


def test_devices_picks_the_device_and_backend_this_machine_has():
    gpus = torch.cuda.device_count()
    nproc = min(2, gpus) if gpus else 2
    data = launch("ddp_scripts/02_devices/devices.py", nproc=nproc, out=True, timeout=120,
                  echo=False).data
    assert data["all_reduce_sum"] == nproc * (nproc + 1) / 2
    for r in data["ranks"]:
        own = f"cuda:{r['local_rank']}" if gpus else "cpu"
        assert r["device"] == own and r["loaded_with_map_location"] == own
        assert r["backend"] == ("nccl" if gpus else "gloo")


def test_devices_forced_to_cpu_uses_gloo():
    data = launch("ddp_scripts/02_devices/devices.py", "--device", "cpu", nproc=2, out=True,
                  timeout=120, echo=False).data
    assert {(r["device"], r["backend"]) for r in data["ranks"]} == {("cpu", "gloo")}


def test_devices_asking_for_more_gpus_than_visible_fails_clearly():
    gpus = torch.cuda.device_count()
    result = launch("ddp_scripts/02_devices/devices.py", "--device", "cuda", nproc=gpus + 1,
                    timeout=120, echo=False, expect_failure=True)
    expected = (f"{gpus + 1} process(es) on this node but {gpus} visible GPU(s)" if gpus
                else "--device cuda, but no GPU is visible")
    assert expected in result.output


def test_devices_refuses_nccl_for_cpu_tensors_before_starting():
    result = launch("ddp_scripts/02_devices/devices.py", "--device", "cpu", "--backend", "nccl",
                    nproc=None, timeout=120, echo=False, expect_failure=True)
    assert result.returncode == 2 and "NCCL only moves CUDA tensors" in result.output


def test_collectives_on_three_ranks_with_chunks_smaller_than_the_world():
    data = launch("ddp_scripts/10_collectives/ring.py", "--ring-sizes", "2", "5", "100",
                  "--timing-numel", "3001", "--repeats", "1", "--ring-world-sizes", "2", "3",
                  nproc=3, out=True, timeout=120, echo=False).data
    assert [ring["world_size"] for ring in data["rings"]] == [2, 3]  # 2: a group of ranks 0, 1
    for ring in data["rings"]:
        assert [c["size"] for c in ring["ring_checks"]] == [2, 5, 100]
        assert all(c["equal"] for c in ring["ring_checks"])
    assert [r["elements_sent"] for r in data["rings"][0]["traffic"]["ranks"]] == [3001, 3001]
    # 3001 = 1001 + 1000 + 1000; rank r skips chunk (r+1) % 3 in phase 1 and (r+2) % 3 in
    # phase 2, so rank 0 skips two short chunks and sends one element more than the others
    traffic = data["rings"][1]["traffic"]
    assert [r["elements_sent"] for r in traffic["ranks"]] == [4002, 4001, 4001]
    if traffic["bytes_counted_by"]:  # the kernel's count: 4 bytes an element, equal headers
        assert len({r["ring_bytes"] - 4 * r["elements_sent"] for r in traffic["ranks"]}) == 1
    data = launch("ddp_scripts/10_collectives/collectives.py", nproc=3, out=True, timeout=120,
                  echo=False).data
    ops = {name: {side: [mine[name][side] for mine in data["ranks"]]
                  for side in ("before", "after")} for name in data["ranks"][0]}
    if data["backend"] == "gloo":  # a longer receive buffer: no error, the tail untouched
        assert ops["recv into a longer tensor"]["after"][1] == [0.0, 1.0, -1.0]
    assert ops["all_reduce"]["after"] == [[6.0]] * 3
    assert ops["isend/irecv"]["after"] == [[3.0], [1.0], [2.0]]
    assert ops["reduce_scatter"]["after"] == [[30.0], [33.0], [36.0]]


def test_backends_measures_every_size_and_probes_every_operation():
    data = launch("ddp_scripts/11_backends/bandwidth.py", "--sizes", "1024", "65536",
                  "--seconds-per-size", "0.02", nproc=2, out=True, timeout=120,
                  echo=False).data
    assert [r["bytes"] for r in data["rows"]] == [1024, 65536]
    for r in data["rows"]:
        assert r["seconds"] > 0 and r["iterations"] >= 3
        assert abs(r["busbw"] - r["algbw"]) < 1e-9 * r["algbw"]  # 2 ranks: factor 1
    data = launch("ddp_scripts/11_backends/backends.py", nproc=2, out=True, timeout=120,
                  echo=False).data
    assert len(data["supported"]) == 10
    ops = data["reduce_ops"]
    assert set(ops) == set(torch.distributed.ReduceOp.RedOpType.__members__)
    assert ops["SUM"]["float32"] == {"ok": True, "result": 3.0}  # ranks hold 1 and 2
    assert ops["MAX"]["int64"] == {"ok": True, "result": 2}
    assert data["average_by_sum"] == 1.5  # DDP's buckets: tests/test_lesson_11.py


def test_backends_refuses_a_backend_this_build_lacks():
    missing = next(name for name in ("mpi", "ucc", "nccl")
                   if not torch.distributed.is_backend_available(name))
    result = launch("ddp_scripts/11_backends/backends.py", "--backend", missing, nproc=2,
                    timeout=120, echo=False, expect_failure=True)
    assert f"backend {missing} is not available in this PyTorch build" in result.output


def test_init_methods_env_under_torchrun():
    data = launch("ddp_scripts/12_init_methods/init_methods.py", "--methods", "env", nproc=3,
                  out=True,
                  timeout=120, echo=False).data
    (attempt,) = data["attempts"]
    assert attempt["ok"] and attempt["sum_of_ones"] == 3
    assert sorted(m["rank"] for m in attempt["members"]) == [0, 1, 2]


def test_init_methods_need_their_meeting_point():
    result = launch("ddp_scripts/12_init_methods/init_methods.py", "--methods", "tcp", nproc=None,
                    timeout=60, echo=False, expect_failure=True)
    assert result.returncode == 2 and "--methods tcp needs --port" in result.output


def test_init_methods_without_rank_variables_says_how_to_start():
    result = launch("ddp_scripts/12_init_methods/init_methods.py", nproc=None, timeout=60,
                    echo=False,
                    expect_failure=True)
    assert "RANK, WORLD_SIZE not set" in result.output


def test_init_methods_lone_rank_with_a_fresh_file_waits_then_times_out(tmp_path):
    # The contrast lesson 12 draws with a stale file: a fresh one makes rank 1 wait.
    result = launch_ranks("ddp_scripts/12_init_methods/init_methods.py", "--methods", "file",
                          "--file",
                          tmp_path / "fresh", "--timeout", 1, nproc=2, only_ranks=[1],
                          timeout=60, echo=False, expect_failure=True)
    assert "Wait timeout" in result.output and "connectFullMesh" not in result.output


def test_ddp_equivalence_on_three_ranks():
    data = launch("ddp_scripts/13_inside_ddp/equivalence.py", "--batch", "30", "--steps", "3",
                  nproc=3,
                  out=True, timeout=120, echo=False).data
    eq = data["equivalence"]
    assert eq["plain"]["max_abs_diff"] < 1e-6 and eq["plain"]["samples_per_rank"] == 10
    assert eq["sum_loss"]["max_abs_diff"] > 1e-4
    broadcast = launch("ddp_scripts/13_inside_ddp/broadcast.py", nproc=3, out=True, timeout=120,
                       echo=False).data["ranks"]
    assert len({b["after"] for b in broadcast}) == 1
    assert len({tuple(b["buffer_at_forward"]) for b in broadcast}) == 1
    data = launch("ddp_scripts/13_inside_ddp/buckets.py", nproc=3, out=True, timeout=120,
                  echo=False).data
    default, unused = ([[b["params"] for b in s["buckets"]] for s in data[key]["steps"]]
                       for key in ("buckets", "buckets_find_unused"))
    assert len(default[0]) == 1 and len(default[1]) >= 2 and default[2] == default[1]
    assert len(unused[0]) >= 2 and unused[0] == unused[1] == unused[2]


def test_ddp_refuses_a_batch_that_does_not_split():
    result = launch("ddp_scripts/13_inside_ddp/equivalence.py", "--batch", "31", nproc=2,
                    timeout=120,
                    echo=False, expect_failure=True)
    assert "--batch 31 must be divisible by the world size 2" in result.output


def test_ddp_training_reduces_metrics_exactly():
    data = launch("ddp_scripts/03_ddp_training/ddp_training.py", "--epochs", "2", nproc=2, out=True,
                  timeout=120, echo=False).data
    assert len(data["history"]) == 2
    for h in data["history"]:
        assert h["reduced"] == h["single"] and h["reduced_count"] == data["test_size"]
        assert h["naive_count"] == data["test_size"] + 1  # 357 padded to 358
    assert data["train_size"] == 1440 and data["test_size"] == 357
    facts = launch("ddp_scripts/03_ddp_training/sampler.py", nproc=2, out=True, timeout=120,
                   echo=False).data["ranks"]
    assert sorted(i for f in facts for i in f["shard"]) == list(range(1440))


def test_detail_debug_level_crashes_ddp_construction_on_this_torch():
    # Lesson 21 says so. When a PyTorch release fixes it, this test fails: update the
    # lesson (and this test) then.
    crashed = launch("tests/fixtures/ddp_construct.py", nproc=1, timeout=120, echo=False,
                     expect_failure=True, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert "debug level DebugLevel.DETAIL" in crashed.output
    assert "constructed" not in crashed.output and "SIGSEGV" in crashed.output
    fine = launch("tests/fixtures/ddp_construct.py", nproc=1, timeout=120, echo=False,
                  env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert "stepped" in fine.output


def test_checkpointing_resume_on_four_ranks(tmp_path):
    data = launch("ddp_scripts/04_checkpointing/resume.py", "--dir", tmp_path, nproc=4, out=True,
                  timeout=180, echo=False).data
    assert data["steps_per_epoch"] == 2 and data["stop_at"] == 3  # stops mid-epoch
    resume = data["resume"]
    # Lesson 04: on 4 ranks, the fresh model's bucket layout changes the order of the
    # all-reduce's sums for one step, so the full resume is close but not bit for bit
    assert 0 < resume["full"]["max_abs_diff"] < 1e-6
    assert all(resume[v]["max_abs_diff"] > 1e-4 for v in
               ("no_optimizer_state", "no_momentum", "no_lr", "no_scheduler_state",
                "no_rng_state", "wrong_step", "wrong_epoch"))
    lrs = resume["lrs"]  # the stop (step 3) is after the first halving (step 2)
    assert lrs["no_momentum"] == lrs["uninterrupted"] == [0.05, 0.025, 0.025]
    assert lrs["no_lr"] == lrs["no_optimizer_state"] == [0.1, 0.05, 0.05]


def test_checkpointing_atomic_writes_on_four_ranks(tmp_path):
    data = launch("ddp_scripts/22_checkpoints_survive/atomic_writes.py", "--dir", tmp_path, nproc=4,
                  out=True,
                  timeout=180, echo=False).data
    assert all(t["max_abs_diff"] < 1e-6 for t in data["truncated"].values())
    assert [c["error"].split(":")[0] for c in data["cuts"]] == [
        "EOFError", "UnpicklingError", "RuntimeError", "OSError", "OSError", "RuntimeError"]


def test_checkpointing_two_workers_per_rank_on_four_ranks(tmp_path):
    # two workers per rank: batches go to them in turn, and the resume still replays them
    workers = launch("ddp_scripts/22_checkpoints_survive/workers.py", "--dir", tmp_path,
                     "--workers", "2",
                     nproc=4, out=True, timeout=180, echo=False).data
    assert workers["workers"] == 2
    assert workers["seeded_per_epoch"]["max_abs_diff"] < 1e-6
    assert workers["seeded_once"]["max_abs_diff"] > 1e-4
    assert len({s["1"] for s in workers["seeded_per_epoch"]["seeds_every_rank"]}) == 4


def test_checkpointing_dcp_of_four_ranks_loaded_into_two(tmp_path):
    saved = launch("ddp_scripts/22_checkpoints_survive/dcp.py", "--dir", tmp_path, nproc=4,
                   out=True,
                   timeout=180, echo=False).data
    assert saved["rows_per_rank"] == 3
    loaded = launch("ddp_scripts/22_checkpoints_survive/dcp.py", "--load", saved["folder"], nproc=2,
                    out=True,
                    timeout=120, echo=False).data
    assert loaded["table_equal"] and loaded["model_equal"]
    assert [r["rows"] for r in loaded["ranks"]] == [6, 6]


def test_checkpointing_resume_is_exact_on_four_ranks_with_one_parameter_tensor():
    # The other half of lesson 04's explanation: with a single tensor there is only one
    # bucket layout, so the fresh model sums in the same order and the resume is exact.
    data = launch("ddp_scripts/04_checkpointing/resume.py", "--one-tensor", nproc=4, out=True,
                  timeout=180,
                  echo=False).data
    assert data["resume"]["full"]["equal"]
    assert data["resume"]["no_rng_state"]["max_abs_diff"] > 1e-4
    # and with augmentation in two workers per rank, reseeded every epoch: exact too
    workers = launch("ddp_scripts/22_checkpoints_survive/workers.py", "--one-tensor", "--workers",
                     "2", nproc=4,
                     out=True, timeout=180, echo=False).data
    assert workers["seeded_per_epoch"]["equal"]
    assert not workers["seeded_once"]["equal"]


def test_checkpointing_refuses_a_stop_outside_the_run():
    result = launch("ddp_scripts/04_checkpointing/resume.py", "--stop-at", "12", nproc=2,
                    timeout=120, echo=False, expect_failure=True)
    assert "--stop-at must be between 1 and 11 (the run has 12 steps)" in result.output


def test_fault_tolerance_survives_losing_rank_0(tmp_path):
    # rank 0 writes the checkpoints: kill it right after one, mid-epoch
    data = launch("ddp_scripts/23_fault_tolerance/fault_tolerance.py", "--kill-at", "6",
                  "--kill-rank", "0",
                  "--dir", tmp_path, nproc=2, max_restarts=2, out=True, timeout=180,
                  echo=False).data
    assert data["restart"] == 1 and data["equal"]
    resumed = [e for e in data["events"] if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [6, 6]


def test_fault_tolerance_fix_holds_when_rank_0_rejoins_late(tmp_path):
    # With a plain init, rank 0 arriving late after a restart made 3 of 4 runs fail.
    data = launch("ddp_scripts/23_fault_tolerance/fault_tolerance.py", "--kill-at", "1",
                  "--slow-rejoin",
                  "0.5", "--dir", tmp_path, nproc=2, max_restarts=1, out=True, timeout=180,
                  echo=False).data
    assert data["restart"] == 1 and data["equal"]


def test_fault_tolerance_with_the_environment_variable_fix(tmp_path):
    data = launch("ddp_scripts/23_fault_tolerance/fault_tolerance.py", "--kill-at", "3", "--init",
                  "plain",
                  "--dir", tmp_path, nproc=2, max_restarts=2, out=True, timeout=180,
                  echo=False, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}).data
    assert data["restart"] == 1 and data["equal"]
    starts = [e for e in data["events"] if e["event"] == "start"]
    assert all(e["addresses_in_store"] == [] for e in starts)  # no shared store at all


def test_fault_tolerance_gives_up_when_every_attempt_is_killed(tmp_path):
    result = launch("ddp_scripts/23_fault_tolerance/fault_tolerance.py", "--kill-at", "0",
                    "--kill-every-attempt", "--dir", tmp_path, nproc=2, max_restarts=1,
                    timeout=120, echo=False, expect_failure=True)
    # The report lists every failure; the root cause is the one with the smallest whole-second
    # timestamp, which can be a survivor that raised (and wrote its error file) a second before
    # torchrun saw the killed one dead (lesson 23).
    report = result.output.split("Failures:")[-1]
    assert "exitcode  : -9" in report and "SIGKILL" in report
    kills = [line for line in (tmp_path / "events.jsonl").read_text().splitlines()
             if '"kill"' in line]
    assert len(kills) == 2  # attempt 0 and the one restart


def test_fault_tolerance_without_restarts_the_job_fails(tmp_path):
    result = launch("ddp_scripts/23_fault_tolerance/fault_tolerance.py", "--kill-at", "3", "--dir",
                    tmp_path,
                    nproc=2, timeout=120, echo=False, expect_failure=True)
    assert "exitcode  : -9" in result.output
    assert not (tmp_path / "step-000004.pt").exists()  # it never got that far


def test_torch_dynamo_imported_after_the_group_keeps_gloo_threads_past_destroy():
    """Why every DDP script imports torch._dynamo before init_process_group (lesson 13):
    DDP's constructor imports it (torch 2.13); imported after the group exists, it keeps
    the group alive through destroy_process_group, and Gloo's threads with it. (Linux: the
    fixture reads the threads' names in /proc.) Cold launches: a warm worker has imported
    torch._dynamo before the script starts (tools/zygote.py), so it is always "first"."""
    def threads(*args):
        result = launch("tests/fixtures/gloo_threads.py", *args, nproc=2, timeout=90,
                        echo=False, env={"DDP_COURSE_COLD_LAUNCH": "1"})
        assert not result.warm
        return [line for line in result.output.splitlines() if "threads after destroy" in line]

    late, first = threads(), threads("--import-first")
    assert len(late) == len(first) == 2
    assert all("pt_gloo_runloop" in line for line in late), late
    assert not any("gloo" in line for line in first), first


def test_a_ddp_model_in_a_reference_cycle_keeps_gloo_threads_unless_collected_first():
    """Why ddp_common.teardown calls gc.collect() before destroy_process_group (lesson 02)."""
    def threads(*args):
        result = launch("tests/fixtures/gloo_threads.py", "--import-first", "--cycle", *args,
                        nproc=2, timeout=90, echo=False)
        return [line for line in result.output.splitlines() if "threads after destroy" in line]

    kept, collected = threads(), threads("--collect")
    assert len(kept) == len(collected) == 2
    assert all("pt_gloo_runloop" in line for line in kept), kept
    assert not any("gloo" in line for line in collected), collected


def test_ddp_common_checks_a_launch_and_refuses_plain_python():
    """ddp_scripts/shared/ddp_common.py (lesson 02), run on its own: every rank joins, the sum of
    the ones is the world size; without torchrun it names what is missing."""
    result = launch("ddp_scripts/shared/ddp_common.py", nproc=3, timeout=120, echo=False)
    for rank in range(3):
        assert f"rank {rank} of 3 on cpu with gloo: the sum of 3 ones is 3" in result.output \
            or torch.cuda.is_available()
    plain = launch("ddp_scripts/shared/ddp_common.py", nproc=None, timeout=60, echo=False,
                   expect_failure=True)
    assert "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK" in plain.output
    assert "start it with torchrun" in plain.output


def test_a_ddp_model_deleted_after_its_group_hangs_the_rank_and_teardown_refuses_one():
    """Why every script deletes its DDP model before teardown() (lesson 13, "A clean exit"):
    deleted after destroy_process_group, the model's Reducer destroys the group holding the
    GIL, while a Gloo thread freeing a collective's tensors waits for the GIL. The hung
    rank sits on the fixture's `del model` line; deleted first, every round finishes."""
    fixture = "tests/fixtures/ddp_outlives_group.py"
    line = next(number for number, text in enumerate(open(fixture), start=1)
                if "the Reducer destroys the group here" in text)
    hung = launch(fixture, "--order", "model-last", "--rounds", "100", nproc=2, timeout=30,
                  echo=False, expect_failure=True)
    assert hung.returncode is None  # killed at the timeout
    assert f"<module> (ddp_outlives_group.py:{line})" in hung.output  # py-spy's stack
    fine = launch(fixture, "--order", "model-first", "--rounds", "100", nproc=2, timeout=120,
                  echo=False)
    assert fine.output.count("round 99 done") == 2
    refused = launch(fixture, "--rounds", "1", "--teardown", nproc=2, timeout=120, echo=False,
                     expect_failure=True)
    assert "teardown: 1 DistributedDataParallel model(s) still alive" in refused.output


def test_clusters_script_on_one_machine_under_torchrun():
    ranks = launch("ddp_scripts/32_clusters/clusters.py", "--epochs", "1", nproc=2, out=True,
                   timeout=120, echo=False).data["ranks"]
    assert [(r["rank"], r["node"], r["by_slurm"]) for r in ranks] == [(0, 0, False), (1, 0, False)]
    for r in ranks:  # besides the store's, one Gloo connection: to the other rank
        port = ":" + r["master"].split(":")[1]
        gloo = [c for c in r["connections"]
                if not any(end.endswith(port) for end in c.split(" -> "))]
        assert len(gloo) == 1, r["connections"]


def test_clusters_script_takes_its_rank_from_slurm_variables():
    from tools.launch import free_port

    slurm = {"SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    data = launch_ranks("ddp_scripts/32_clusters/from_slurm.py", "--epochs", "1", nproc=2, out=True,
                        names=("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"), env=slurm,
                        timeout=120, echo=False).data
    assert [(r["rank"], r["local_rank"], r["by_slurm"]) for r in data["ranks"]] == \
        [(0, 0, True), (1, 1, True)]


def test_clusters_script_under_srun_without_master_addr_says_what_to_export():
    result = launch_ranks("ddp_scripts/32_clusters/from_slurm.py", nproc=1, expect_failure=True,
                          names=("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
                          timeout=60, echo=False)
    assert "MASTER_ADDR and MASTER_PORT not set: the batch script must export them" in \
        result.output
    assert "Traceback" not in result.output
