"""The course's lessons, one entry each, in reading order: the core path, then the topics,
each under the question that sends a learner to it.

A lesson's number is its place: the core path is 00 to 09, and each part of the topics has
its own tens (10-19 how DDP works inside, 20-29 when a job fails, 30-39 bigger models and
clusters, 40-49 practice on a whole model), so that the files sort in reading order and a
new lesson fits into its part without renumbering the others. Its scripts live in
ddp_scripts/<stem>/; the modules other lessons' scripts import, in ddp_scripts/shared/
(importable everywhere in .venv).

Everything else that lists lessons is made from this list or tested against it: the course
map (README, lesson 00, the site's index), the site's descriptions and its previous / next
links, the README's table of lessons, each lesson's closing "**Next:**" cell
(`python -m tools.course_map --write` writes the generated ones), `make bench`'s budgets,
and the lessons run again at 3 and 4 ranks (tests/test_world_sizes.py). A notebook missing
here fails tests/test_lessons.py, which says where to add it. CONTRIBUTING.md: adding a
lesson, step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CORE = "core"  # the core path: for someone who must parallelise a training script tomorrow
LESSON_BUDGET_S = 20.0  # seconds a lesson may take on 2 CPU cores (`make bench`)


@dataclass(frozen=True)
class Lesson:
    stem: str  # the notebook's file name, without .ipynb (grading matches it)
    part: str  # CORE, or the question that sends a learner to a topic
    why: str  # the course map's line: what a learner takes it for
    summary: str  # the site index's line: what it teaches
    shows: str  # the README's table: what it shows, executed and checked
    budget_s: float = LESSON_BUDGET_S
    # the world sizes besides 2 at which its claims are checked again, and what changes there
    world_sizes: dict[int, str] = field(default_factory=dict)
    # the modules it writes into ddp_scripts/shared/, which other lessons' scripts import
    shared: tuple[str, ...] = ()


LESSONS = [
    Lesson("00_ddp_in_ten_minutes", CORE,
           "a plain script made DDP, checked equal to one process, timed",
           "A plain training script made DDP with a handful of lines, run on 2 processes, checked "
           "to give one process's weights, and timed against one process.",
           "a plain training script on the digits and the same script with DDP (the new lines "
           "marked, and as a diff), launched on 2 ranks: the same weights as one process "
           "(asserted), and the samples per second of 1 process, N ranks and 1 process with N "
           "threads, measured in the same run and plotted, the speed-up checked; the course map; "
           "exercises: add the DDP lines to the plain script (the check launches it and compares "
           "it with one process), and the samplers that make every DDP step the plain step",
           world_sizes={3: "each rank's share of the data, equal weights to one process",
                       4: "the quick start invites WORLD_SIZE=4"},
           shared=("digits_cnn.py",)),
    Lesson("01_how_the_course_works", CORE,
           "how the lessons launch scripts and report their failures",
           "Why DDP code runs in a script that torchrun launches, not in the notebook; what "
           "torchrun gives each rank; reading per-rank output and failure reports.",
           "why DDP runs in a script (spawn of a notebook function fails, shown), every variable "
           "torchrun sets per rank, reading per-rank output and torchrun's failure report (Root "
           "Cause, `Failures:`, what `@record` adds), parameters; exercises: each rank says where "
           "it is (rank, local rank, node) on two torchrun nodes, and a rank with no data fails so "
           "that torchrun names it, both in scripts the checks launch"),
    Lesson("02_devices", CORE,
           "one device per rank, and what changes on GPUs",
           "torch.device on CPU and GPU, cross-device errors, one device per rank from LOCAL_RANK, "
           "CUDA_VISIBLE_DEVICES and map_location.",
           "`torch.device`, what the machine has, the cross-device error, `LOCAL_RANK` to device, "
           "backend from device, `CUDA_VISIBLE_DEVICES`, `map_location`; "
           "`ddp_scripts/shared/ddp_common.py`, the plumbing every later script imports (`setup`: "
           "torchrun check, device, group; `teardown`; `arguments`: the options every script "
           "takes; `report`: every rank's results gathered and written by rank 0), launched on its "
           "own to check that a launch works",
           shared=("ddp_common.py",)),
    Lesson("03_ddp_training", CORE,
           "the sampler, metrics over all ranks, logging from rank 0",
           "Training with DDP in practice: DistributedSampler and set_epoch, metrics reduced "
           "across ranks, rank-0 logging, a real dataset on 2 ranks.",
           "`DistributedSampler` shards and `set_epoch`, loss and accuracy reduced over ranks, "
           "rank-0 logging, padded evaluation skewing the naive metric, scikit-learn's digits "
           "trained to over 95% on 2 ranks and on 1 process, with the same weights; exercise: fix "
           "a DDP script's `fit` (`set_epoch`, accuracy summed over ranks) that the check launches",
           world_sizes={3: "the sampler's padding and metrics summed over ranks"},
           shared=("digits_data.py",)),
    Lesson("04_checkpointing", CORE,
           "save and resume a DDP run exactly",
           "Saving and resuming DDP training: rank-0 saves, the module. prefix, the full training "
           "state, an exact resume, and what each missing piece does.",
           "rank-0 save and barrier, `map_location`, the `module.` prefix, the full training state "
           "(model, optimizer, scheduler, step, every rank's RNG states), a resumed run equal to "
           "an uninterrupted one bit for bit and what breaks it (all eight variants plotted; "
           "momentum and learning rate measured apart); exercises: a resume position, stripping "
           "the `module.` prefix, and a DDP run's `save_checkpoint` and `load_checkpoint` in a "
           "script the check launches (only rank 0 writes, nobody reads early, a bit-exact resume)",
           world_sizes={3: "resuming the sampler at any world size"},
           shared=("training_run.py", "checkpoints.py")),
    Lesson("05_real_training", CORE,
           "unused parameters, gradient accumulation, mixed precision",
           "DDP in real training code: unused parameters and their fixes, gradient "
           "accumulation with no_sync, bf16, fp16 and clipping.",
           "a skipped branch's parameters stopping DDP at the next step (\"Expected to have "
           "finished reduction\"), named with the debug level `INFO`, fixed with "
           "`find_unused_parameters=True` (a gradient averaged over ranks that disagree) and with "
           "`static_graph=True`; gradient accumulation with `no_sync` equal to one big batch with "
           "the all-reduces counted, and "
           "the two common bugs; bf16 autocast, clipping (the same norm on every rank), fp16 with "
           "a `GradScaler` skipping its overflowing steps and `unscale_` before clipping; "
           "exercise: accumulation over micro-batches of unequal sizes in a script the check "
           "launches",
           world_sizes={3: "the global batch of gradient accumulation"}),
    Lesson("06_the_script", CORE,
           "every piece in one plain PyTorch file, proven",
           "One DDP training script in plain PyTorch to start your own from, proven to train the "
           "same model at 1 to 4 ranks and to resume bit for bit after a rank dies.",
           "a DDP training script in plain PyTorch (no course helpers): `DistributedSampler` with "
           "`set_epoch` and a sampler that resumes mid-epoch, the global batch and the learning "
           "rate rule, accumulation under `no_sync`, bf16/fp16 with a `GradScaler`, clipping, "
           "a checkpoint with model, optimizer, scheduler, scaler, step and every rank's random "
           "state written atomically, exact validation through `model.module`, rank-0 TensorBoard, "
           "a clean exit; the same weights and validation at 1, 2, 3 and 4 ranks (asserted and "
           "plotted), a rank killed and the job restarted by torchrun ending bit for bit where an "
           "uninterrupted run ends, `SyncBatchNorm` refusing the CPU; a one-page checklist for "
           "converting your own script",
           budget_s=40.0),
    Lesson("10_collectives", "How DDP works inside",
           "what all-reduce and the other collectives do",
           "Point-to-point messages and every collective (broadcast, reduce, all_reduce, gather, "
           "scatter, ...) across ranks, and a ring all-reduce written by hand.",
           "send/recv, isend/irecv and every collective on 2 and 4 ranks, drawn and asserted; a "
           "hand-written ring all-reduce equal to `dist.all_reduce`, its exact cost for any world "
           "size counted by the kernel, and why no all-reduce can send less; exercise: write the "
           "ring's reduce-scatter in a script the check launches",
           world_sizes={3: "the ring's chunks and every collective's result"}),
    Lesson("11_backends", "How DDP works inside",
           "Gloo, NCCL and MPI, and how fast they move data",
           "Gloo, NCCL and MPI: what each supports, picking one from the device, and all_reduce "
           "time and bandwidth measured from 1 KiB to 64 MiB.",
           "Gloo / NCCL / MPI and what this build has, backend from device, `cpu:gloo,cuda:nccl`, "
           "every operation probed, all_reduce time, algbw and busbw from 1 KiB to 64 MiB plotted "
           "against a memory copy, why DDP buckets, `GLOO_SOCKET_IFNAME` failing on purpose; "
           "exercise: a mean over the ranks for every dtype (Gloo's `AVG` refuses integers) in a "
           "script the check launches"),
    Lesson("12_init_methods", "How DDP works inside",
           "how the processes find each other",
           "How the processes find each other: env://, tcp://, file:// and stores, tcp:// under "
           "torchrun, two nodes on one machine.",
           "`env://`, `tcp://`, `file://`, `TCPStore` and `FileStore` forming the same world; two "
           "torchrun agents as two nodes forming one world of 4; `tcp://` under torchrun (every "
           "rank a client)"),
    Lesson("13_inside_ddp", "How DDP works inside",
           "what DDP does at construction and in backward",
           "What DistributedDataParallel does: the broadcast at construction, gradient buckets "
           "all-reduced during backward, training equal to one process, and what "
           "find_unused_parameters costs.",
           "the training loop before and after DDP, `DataParallel` on a CPU, rank 0's weights "
           "broadcast at construction, gradient buckets caught by a communication hook and "
           "overlapped with backward (a per-rank Gantt chart from the hooks' timestamps), the "
           "buckets with and without `find_unused_parameters=True`, DDP equal to one process (2 "
           "and 4 ranks, within 1e-6) and how BatchNorm, a sum loss and a padding sampler break "
           "it; `find_unused_parameters=True` and `static_graph=True` timed per step, reentrant "
           "activation checkpointing failing with `find_unused_parameters` (\"marked as ready "
           "twice\") and its two fixes; three exercises: DDP by hand in scripts the checks launch "
           "(gradients averaged "
           "after backward; during backward with hooks and asynchronous all-reduces; in buckets), "
           "each equal to DDP on the lesson's model and on one with a frozen layer, a frozen bias, "
           "tied weights and branches some or all ranks skip",
           world_sizes={3: "the average over ranks, by hand and by DDP"}),
    Lesson("20_rendezvous_failures", "When a job fails, hangs or crawls",
           "a job that never starts",
           "Rendezvous failures provoked and read: a world that never fills, a taken port, a stale "
           "file; joining a job that Slurm starts.",
           "a world that never fills, a taken port and a stale `file://` file, each provoked and "
           "asserted; exercise: join the group from Slurm's variables (`SLURM_PROCID`, "
           "`SLURM_NTASKS`) in a script the check launches without torchrun"),
    Lesson("21_skewed_speeds", "When a job fails, hangs or crawls",
           "slow ranks, timeouts and uneven inputs",
           "Stragglers, timeouts and hangs: who waits for whom, monitored_barrier naming the late "
           "rank, uneven inputs fixed with Join.",
           "a straggler's delay turned into the other ranks' waiting (a per-rank timeline of "
           "working and waiting), a stalled rank failing the job after the timeout and what "
           "torchrun reports, `monitored_barrier` naming the late rank, "
           "`TORCH_DISTRIBUTED_DEBUG=DETAIL` catching a mismatched collective (and crashing DDP "
           "construction on 2.13), uneven inputs timing out, then `Join` and "
           "`divide_by_initial_world_size`: the all-reduces it adds to each forward (counted), the "
           "optimizer state it lets diverge (momentum), a per-step metric all-reduce it does not "
           "shadow (a bounded hang, then `throw_on_early_termination`); exercise: make an uneven "
           "DDP loop in a script finish, equal to a reference",
           world_sizes={3: "uneven inputs and Join",
                       4: "stragglers and uneven inputs among four ranks, Join with three done"}),
    Lesson("22_checkpoints_survive", "When a job fails, hangs or crawls",
           "checkpoints that survive crashes",
           "Checkpoints that survive: DataLoader workers' seeds, a crash while saving, "
           "weights_only, sharded checkpoints loaded into another number of ranks.",
           "DataLoader workers' seeds made exact (and the workers started from a forkserver "
           "because a fork of a rank can hang one), atomic writes and a truncated checkpoint "
           "skipped with nothing lost (`torch.load`'s error by where the file was cut, plotted), "
           "`weights_only=True` refusing a file that runs code, a DCP checkpoint from 2 ranks "
           "loaded into 1 process (and 3 into 2, 4 into 3); exercise: the newest complete "
           "checkpoint of a folder",
           world_sizes={3: "every rank's workers, and the distributed checkpoint's shards",
                       4: "four ranks' loader workers, and four shards resharded"}),
    Lesson("23_fault_tolerance", "When a job fails, hangs or crawls",
           "a rank that dies: restart and resume",
           "A rank killed mid-training: torchrun restarts the job, which resumes from its "
           "checkpoint and ends with the uninterrupted run's weights.",
           "a rank killed with SIGKILL, `torchrun --max-restarts` restarting the job, the job "
           "resuming from its checkpoint and ending with the uninterrupted run's weights, the "
           "restart's cost, torchrun itself crashing on an error file read while a rank writes it "
           "(provoked every time) and the fix, the dead processes' keys left in torchrun's store, "
           "elastic launch and schedulers",
           shared=("resuming.py",)),
    Lesson("24_store_trap", "When a job fails, hangs or crawls",
           "a restarted job that cannot reconnect",
           "A restarted job that reads the dead processes' addresses from torchrun's store and "
           "fails; the fix, for one node and several, written in a script.",
           "a restarted job's plain `init_process_group` reading the dead processes' addresses and "
           "failing (torch 2.13), torchrun's report when restarts run out, the fixes (a prefix per "
           "restart, `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`) and the torch versions that need "
           "them; exercise: the fix, written in a script the check launches with a restart"),
    Lesson("25_debugging", "When a job fails, hangs or crawls",
           "a hung job: which rank, where",
           "Three hangs provoked and diagnosed: the flight recorder, torchfrtrace, py-spy stacks, "
           "TORCH_DISTRIBUTED_DEBUG=DETAIL and a breakpoint on one rank.",
           "three common hangs provoked and ended by a short collective timeout (a metric reduced "
           "on rank 0 only, rank 0 evaluating through the DDP wrapper, one rank's stalled data "
           "loader); each rank's flight recorder dumped and read (the ranks part at one sequence "
           "number), `torchfrtrace` failing on torch 2.13's Gloo dumps and, after renaming the "
           "group, naming the mismatch; `TORCH_DISTRIBUTED_DEBUG=DETAIL`'s fingerprint check, "
           "`@record`'s root cause, py-spy stacks of every rank, `torch.distributed.breakpoint()` "
           "driven by a scripted stdin; exercises: find the first mismatched collective in the "
           "dumps, and the ranks stuck outside communication in the stacks"),
    Lesson("26_elastic", "When a job fails, hangs or crawls",
           "a host lost and back: elastic DDP, the step kept",
           "torchrun's elastic mode on two hosts: a host dies, returns and loses its link; the "
           "job shrinks and grows, resuming from a sharded checkpoint, the step kept the step.",
           "an elastic job (`--nnodes=1:2`, c10d rendezvous) on lesson 32's hosts: a host's "
           "processes killed, the host back, its cable pulled; each time the world is rebuilt and "
           "resumes from a DCP checkpoint, with the global batch kept by accumulation and each "
           "step's samples drawn from its own seed, so the loss equals the uninterrupted job's "
           "(asserted); the restart count, the seconds each event cost, in a timeline; "
           "exercises: the batch plan for any world size, a resume into any world from a folder "
           "with no pointer (hidden: 3 ranks from 4, a save cut short), the steps done twice",
           budget_s=45),
    Lesson("30_beyond_allreduce", "Bigger models and real clusters",
           "compression, ZeRO, FSDP2 and torch.compile",
           "Compression hooks (fp16, PowerSGD) with the bytes counted, ZeRO and FSDP2 against DDP "
           "per rank, torch.compile on a DDP model; ZeRO written by hand.",
           "`fp16_compress_hook` and PowerSGD with the bytes on the wire counted (half; about 70 "
           "times fewer) and their loss after 30 steps, `bf16_compress_hook` refused by Gloo, "
           "`gradient_as_bucket_view`; `ZeroRedundancyOptimizer` and FSDP2 (`fully_shard`) against "
           "DDP: weights, gradients and Adam state per rank, the collectives each adds "
           "(all-gathers and reduce-scatters, the halves of lesson 10's all-reduce), the same "
           "weights; `torch.compile` on a DDP model split into one graph per bucket, its compile "
           "time, a bare `nn.Sequential` compiled into nothing and `bucket_cap_mb` under 1 refused "
           "(torch 2.13); exercise: ZeRO by hand (reduce-scatter, a momentum shard, all-gather) in "
           "a script the check launches",
           world_sizes={3: "ZeRO's and FSDP2's shards"}),
    Lesson("31_pipeline_ddp", "Bigger models and real clusters",
           "a model split over processes",
           "A network split into two stages, each replicated with DDP over its own group, equal to "
           "one process; RPC and its status; logging to TensorBoard.",
           "a network split into two stages exchanging activations and gradients with `send` / "
           "`recv`, each stage replicated with DDP over its own `new_group` (2 stages × 2 "
           "replicas, 4 processes), equal to one process; the pipeline bubble and micro-batches (a "
           "GPipe schedule drawn); `torch.distributed.pipelining`'s `ScheduleGPipe` over the same "
           "stages, its measured schedule plotted, equal to one process; `torch.distributed.rpc` "
           "(`rpc_sync`, an `RRef`) running, in maintenance mode, with the deprecation warning "
           "torch raises from its own set-up; rank 0 logging to TensorBoard, the event file read "
           "back and plotted; where the stages should sit on a cluster; exercise: a GPipe step "
           "with micro-batches (sends counted, the two stages overlapping as the call log shows, "
           "equal to one process) in a script the check launches",
           world_sizes={3: "the stage and data-parallel groups",
                       4: "a 2 x 2 grid of stages and data-parallel groups"}),
    Lesson("32_clusters", "Bigger models and real clusters",
           "several hosts and Slurm",
           "Two hosts and a Slurm cluster on one machine: torchrun across hosts, sbatch with srun "
           "python and srun torchrun, four launch failures provoked (needs root).",
           "two hosts on one machine (network namespaces with their own names, addresses and "
           "`eth0`, `tools/cluster.py`); lesson 03's training across them with `torchrun "
           "--rdzv-backend=c10d`, every rank's TCP connections read from `/proc`; a real Slurm "
           "22.05 cluster: `sbatch` with `srun python` (Slurm's variables mapped) and with `srun "
           "torchrun`, `squeue`, the same training as by hand; a rendezvous host a node cannot "
           "resolve, Gloo on `127.0.1.1` without `GLOO_SOCKET_IFNAME`, a link taken down mid-job, "
           "a node waiting alone for the join timeout, each provoked, bounded and asserted; a "
           "Kubernetes manifest (Indexed Job + headless Service) checked against the run; needs "
           "Linux and root, and removes everything it made even when it fails; exercises: expand "
           "Slurm's node lists (checked against `scontrol`), and the `srun torchrun` batch script, "
           "which the check submits",
           budget_s=45.0),
    Lesson("33_will_it_scale", "Bigger models and real clusters",
           "predict a step's cost before adding GPUs",
           "All-reduce fitted to latency and bandwidth, DDP steps predicted from compute and "
           "buckets and checked, bucket_cap_mb swept, and when DP stops scaling on GPUs.",
           "Gloo's all-reduce fitted to latency and bandwidth (α, β) and plotted against its "
           "measurements; a DDP step predicted from the plain step's compute and each bucket's "
           "all-reduce, with and without overlap, against the measurement; `bucket_cap_mb` swept "
           "(16, 4 and 1 buckets); DDP's own timers (`_get_ddp_logging_data`); when a step's "
           "all-reduce hides behind backward on H100s (NVLink, InfiniBand) and where data "
           "parallelism stops scaling; exercises: the ring step's latency and bandwidth for any "
           "world size, and the largest world that still hides its all-reduce"),
    Lesson("34_slow_link", "Bigger models and real clusters",
           "a slow link between hosts",
           "Lesson 32's two hosts on a link limited to 100 Mbit/s with tc: the step time predicted "
           "from the bytes on the wire, then fp16 and PowerSGD win it back (needs root).",
           "lesson 32's two hosts with their link limited by `tc`'s token bucket (TBF) to 100 "
           "Mbit/s, the rate measured; DDP's step on the fast and the slow link, predicted from "
           "the gradients' bytes on the wire (counted from `/proc/net/dev`) and the rate; "
           "`fp16_compress_hook` and PowerSGD winning the step back, measured, their losses "
           "compared; needs Linux and root, and removes everything it made; exercises: the ring "
           "all-reduce's seconds on `p` hosts at a given rate, and the bytes PowerSGD sends for a "
           "model's shapes at a given matrix rank",
           budget_s=45.0),
    Lesson("40_capstone_gpt", "Practice on a whole model",
           "a small GPT: per-token loss, exact evaluation, FSDP2",
           "A small GPT trained on Python's own documentation with DDP: the global batch, a loss "
           "per token, exact evaluation, a lost rank, and FSDP2, each checked against one process.",
           "a 110,784-parameter GPT (tied embedding) on Python's own documentation (`pydoc_data`, "
           "nothing downloaded), trained in one process, then with DDP (global batch = micro-batch "
           "× accumulation × world size, `no_sync`, bf16 autocast, clipping, warm-up and cosine), "
           "its loss curves held to one process at 2, 3 and 4 ranks; the loss divided once by the "
           "step's tokens against the mean of the ranks' means; exact evaluation (sums and counts) "
           "against a padding sampler; rank 0 evaluating through the wrapper timing out (a buffer "
           "broadcast), and the fix; a rank killed, the job restarted and resumed exactly; "
           "throughput and generated text; FSDP2 as a diff; exercises: the token-weighted gradient "
           "reduction and exact evaluation, graded on tied, frozen and unused parameters",
           budget_s=60.0),
]


def by_stem() -> dict[str, Lesson]:
    return {lesson.stem: lesson for lesson in LESSONS}


def parts() -> list[str]:
    """CORE first, then the topics' questions, in reading order."""
    return list(dict.fromkeys(lesson.part for lesson in LESSONS))
