"""Builds the draft of notebooks/26_elastic.ipynb (WIP, issue 42)."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

cells = []
md = lambda s, **kw: cells.append(new_markdown_cell(s.strip("\n"), **kw))
code = lambda s, tags=None, **meta: cells.append(new_code_cell(s.strip("\n"), metadata={**({"tags": tags} if tags else {}), **meta}))

md("""
# 26 · When the cluster changes size: elastic DDP

Real jobs lose machines: a spot instance is taken back, a node crashes, a switch port dies. With `torchrun --nnodes=MIN:MAX`, the job goes on in a smaller world when a host leaves and grows again when it comes back. This lesson runs that on two hosts made on this machine (lesson 32 builds them; `cluster.up` below does it for you): a host dies, training resumes on the other from the newest checkpoint, the host comes back, and later its cable is pulled. Each time, the training step stays the same step: the loss curve is the uninterrupted job's, within 1e-12 (the worlds sum their gradients in different orders).

**What you will learn**

- how torchrun's elastic mode (`--nnodes=1:2`, the c10d rendezvous) notices a lost host and a returning one, and what each costs in seconds;
- how to keep a step the same step in any world: the global batch kept by accumulation, the samples a function of the step, a sharded checkpoint loaded into any world size;
- which restarts count against `--max-restarts`, and which do not.

**Prerequisites**: [32 · Clusters for real](32_clusters.ipynb) (the two hosts), [22 · Checkpoints that survive](22_checkpoints_survive.ipynb) (DCP), [23 · Fault tolerance](23_fault_tolerance.ipynb) (restarts), [05 · Real training](05_real_training.ipynb) (accumulation).

**This lesson needs Linux and root**, like lesson 32; the next cells stop, saying why, where it cannot run.
""")
code("""
world_size = 2        # ranks per host (torchrun's --nproc-per-node): a world of 4, or 2
steps = 300           # global steps of each job
leave_at = 20         # the step at which nodeB's processes die
launch_timeout = 120  # seconds before a launch is stopped and the cell fails
""", tags=["parameters"])
code("""
import json
import shutil
import time
from pathlib import Path

from tools import cluster
from tools.plots import elastic_timeline

reason = cluster.why_not()
if reason:
    raise RuntimeError(f"This lesson cannot run on this machine: {reason}")
nproc_per_node = world_size  # ranks on each of the 2 hosts
""")
md("""
## 1. One job, two hosts, and room to shrink

`torchrun --nnodes=1:2` starts an *elastic* job: at least 1 host, at most 2. The torchrun on each host is its *agent*: it starts and watches that host's ranks. The agents meet in a *rendezvous*: a shared record, kept in a key-value *store* that the agent on the `--rdzv-endpoint` host serves, of which hosts take part in the current *round*. A round closes once 2 hosts are in, or 1 host and `last_call_timeout` seconds later. Each agent proves it is alive by writing a *heartbeat* (a time stamp) there every `keep_alive_interval` seconds.

If any worker fails, its agent stops its workers and joins a new round; the others do the same once their own workers fail. When the round closes, every agent in it starts fresh workers, with the `RANK` and `WORLD_SIZE` of the new world. A host that arrives while a world is training waits on the round's *wait list*; the running agents see it and start a new round.
""")
code("""
print(f"hosts up in {cluster.up(with_slurm=False):.1f} s")
jobs = Path("/tmp/ddp-course-elastic")
""", tags=["grade-setup"])
md("""
The script, `ddp_scripts/26_elastic/elastic_train.py`, comes in three pieces below. First, **a step is a step in any world**: the global batch (64 samples) stays, whatever the number of ranks; each rank takes micro-batches of 16 and accumulates as many as the world needs (4 ranks: 1 each; 2 ranks: 2 each), and the samples of step *s* are drawn from *s*'s own seed, so a world of 2 that resumes at step 18 takes exactly the samples a world of 4 would have.
""")
md("""
Second, **checkpoints any world can load**: every 3 steps, `torch.distributed.checkpoint` (lesson 22) saves the model and the optimizer's momentum, each rank its part; a file `latest`, replaced atomically (`os.replace`) once every rank has written its part, names the newest. Both hosts see the same folder here; on a real cluster the checkpoints need storage every host can reach. A world of another size loads it as it is. And the way this lesson kills a host on cue: at `--leave-at`, the ranks on `nodeB` kill their agent and exit, as a power cut would end them.
""")
code('''
%%writefile ../ddp_scripts/26_elastic/elastic_train.py
"""Lesson 26: DDP training that a host may leave and rejoin (torchrun's elastic mode).

The digits MLP (lesson 03) with a global batch that stays the same at any world size:
micro-batches of --micro samples, as many per rank as the world needs (`plan_batches`);
the samples of global step s are drawn from s's own seed, so a step is the same step
whichever world runs it. Every --save-every steps, a sharded DCP checkpoint, which a
world of any size loads; a restarted world resumes from the newest. Rank 0 appends a
line per step to DIR/steps.jsonl (JSON: step, world size, loss, time). With --leave-at
STEP, the ranks on --host kill their torchrun agent and exit at that step, as if the
host had died.

    torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d \\\\
        --rdzv-endpoint=nodeA:29400 --rdzv-id=job1 --max-restarts=3 \\\\
        ddp_scripts/26_elastic/elastic_train.py --dir /tmp/job1     # on each host
"""

import json
import os
import signal
import socket
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from ddp_common import arguments, record, report, setup, teardown
from digits_data import load_data, make_model
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def plan_batches(global_batch, micro, world_size):
    """How many micro-batches of `micro` samples each rank accumulates per step so that
    the ranks together take `global_batch` samples; an error if they cannot."""
    if global_batch % (micro * world_size):
        raise ValueError(f"{world_size} ranks cannot take a global batch of {global_batch} "
                         f"in micro-batches of {micro}")
    return global_batch // (micro * world_size)


def step_samples(step, size, global_batch, seed):
    """The samples of global step `step`: a draw of its own seed, whatever the world."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(size, generator=generator)[:global_batch]
''')
code('''
%%writefile -a ../ddp_scripts/26_elastic/elastic_train.py


def newest(folder):
    """The step of the newest complete checkpoint in `folder` (0: none)."""
    pointer = folder / "latest"
    return int(pointer.read_text()) if pointer.exists() else 0


def save(folder, step, model, optimizer):
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder / f"step-{step}")
    dist.barrier()  # every rank's part written: only then is it the newest
    if dist.get_rank() == 0:
        partial = folder / "latest.partial"
        partial.write_text(str(step))
        os.replace(partial, folder / "latest")


def load(folder, step, model, optimizer):
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=folder / f"step-{step}")
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def leave():
    """This host's end: kill the torchrun agent above this process (`torchrun ...` or
    `python -m torch.distributed.run ...`), then exit."""
    pid = os.getppid()
    while pid > 1:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"torch.distributed.run" in command or b"bin/torchrun" in command:
            os.kill(pid, signal.SIGKILL)
            break
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os._exit(1)
''')
code('''
%%writefile -a ../ddp_scripts/26_elastic/elastic_train.py


@record
def main():
    parser = arguments(__doc__, device=False)
    parser.add_argument("--dir", type=Path, required=True, help="checkpoints and the log")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16, help="samples per micro-batch")
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5, help="seconds a collective waits")
    parser.add_argument("--host", default="nodeB", help="the host that --leave-at ends")
    parser.add_argument("--leave-at", type=int, help="the step at which --host's processes die")
    args = parser.parse_args()
    world = setup("cpu", timeout_s=args.timeout, ddp=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    x, y = load_data(0)[0].tensors
    model = DDP(make_model(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = newest(args.dir)
    if start:
        load(args.dir, start, model, optimizer)
    accumulate = plan_batches(args.global_batch, args.micro, world.world_size)
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    log = (args.dir / "steps.jsonl").open("a") if world.rank == 0 else None

    def write(**entry):
        if log:
            log.write(json.dumps({**entry, "world": world.world_size, "restart": restart,
                                  "time": time.time()}) + "\\n")
            log.flush()

    write(event="start", step=start)
    for step in range(start, args.steps):
        if step == args.leave_at and start == 0 and socket.gethostname() == args.host:
            leave()
        samples = step_samples(step, len(x), args.global_batch, seed=0)
        total = torch.zeros((), dtype=torch.float64)
        for k in range(accumulate):
            first = (k * world.world_size + world.rank) * args.micro
            mine = samples[first:first + args.micro]
            last = k == accumulate - 1  # only its backward all-reduces (forward and
            with nullcontext() if last else model.no_sync():  # backward under no_sync)
                loss = F.cross_entropy(model(x[mine]), y[mine], reduction="sum")
                (loss * world.world_size / args.global_batch).backward()  # DDP averages
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(total)
        write(step=step + 1, loss=total.item() / args.global_batch)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save(args.dir, step + 1, model, optimizer)
    report(args.out, {"rank": world.rank, "host": socket.gethostname()}, resumed_from=start,
           weights=torch.cat([p.detach().flatten() for p in model.module.parameters()]).tolist())
    del model
    teardown()


if __name__ == "__main__":
    main()
''')
md("""
The job, uninterrupted: the same command on both hosts (`GLOO_SOCKET_IFNAME=eth0`: the interface Gloo sends on, lesson 32). A step number in the log is the number of steps done: "a world starts at step 18" means it resumes after step 18. `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` gives each new world a store of its own (with the agent's store shared, a world that grows fails to form on torch 2.13); the `--rdzv-conf` values shorten the waits (section 3 says which, and why).
""")
code("""
def torchrun(job, *extra):
    return ["GLOO_SOCKET_IFNAME=eth0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun",
            "--nnodes=1:2", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            "--rdzv-endpoint=nodeA:29400", f"--rdzv-id={job}", "--max-restarts=3",
            "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=4",
            "ddp_scripts/26_elastic/elastic_train.py", "--dir", str(jobs / job),
            "--steps", str(steps), *extra]


def read_log(job):
    return [json.loads(line) for line in (jobs / job / "steps.jsonl").read_text().splitlines()]


shutil.rmtree(jobs, ignore_errors=True)
plain = cluster.launch_on([("nodeA", torchrun("plain")), ("nodeB", torchrun("plain"))],
                          "ddp_scripts/26_elastic/elastic_train.py", out=True, echo=False,
                          timeout=launch_timeout)
plain_log = read_log("plain")
plain_loss = {e["step"]: e["loss"] for e in plain_log if "loss" in e}
print(f"{plain.data['world_size']} ranks on {sorted({r['host'] for r in plain.data['ranks']})}, "
      f"{len(plain_loss)} steps in {plain.seconds:.1f} s; loss {plain_loss[1]:.3f} -> "
      f"{plain_loss[steps]:.3f}")
""")
code("""
ranks = plain.data["world_size"]
assert ranks == 2 * nproc_per_node, f"expected {2 * nproc_per_node} ranks, got {ranks}"
assert sorted(plain_loss) == list(range(1, steps + 1)), "expected every step once, in order"
assert [e["world"] for e in plain_log if e.get("event")] == [2 * nproc_per_node], \\
    f"expected one world of {2 * nproc_per_node}, no restart: " \\
    f"{[e for e in plain_log if 'event' in e]}"
""", tags=["check"])
md("""
## 2. A host dies, comes back, and loses its cable

The same job again, with three events:

1. at step 20, nodeB's processes die (`--leave-at`): its agent and its ranks;
2. once the world of 2 has trained a step, nodeB's operator starts the same command again: the host is back;
3. once the world of 4 has trained 10 more steps, nodeB's cable is pulled (`cluster.set_link`), and plugged back once the job has ended.

`launch_on` runs the commands as their hosts would:

| what | when | does |
|---|---|---|
| nodeA's torchrun | at once | the job's first host, to the end |
| nodeB's torchrun (`--leave-at 20`) | at once | dies at step 20 (exit status -9: killed by SIGKILL) |
| nodeB's torchrun again, the same command | when the world of 2 has trained a step | the host back (`--leave-at` applies only to a world that started at step 0) |
| a cue: `cluster.set_link("nodeB", False)` | when that world of 4 has trained 10 steps | the cable pulled |
| a cue: `cluster.set_link("nodeB", True)` | when the last step is done | the cable back: nodeB's agent finds the job gone and exits with 1 |

`independent=True`: a command that fails does not stop the others, as on real machines. A third element in a run, and each cue, is (condition, ...): the launcher checks conditions about every 0.2 s, so an event comes a few steps after its condition first held.
""")
code("""
def trained(log, world):
    \"\"\"Steps done by the newest world, if it has `world` ranks.\"\"\"
    starts = [k for k, e in enumerate(log) if e.get("event")]
    return len(log) - 1 - starts[-1] if starts and log[starts[-1]]["world"] == world else 0


def now_log():
    return read_log("events") if (jobs / "events" / "steps.jsonl").exists() else []


moments = {}


def mark(what):
    moments[what] = time.time()


command = torchrun("events", "--leave-at", str(leave_at))
starts = lambda: [e for e in now_log() if e.get("event")]  # noqa: E731
events = cluster.launch_on(
    [("nodeA", command), ("nodeB", command),
     ("nodeB", command, lambda: trained(now_log(), nproc_per_node) >= 1)],
    "ddp_scripts/26_elastic/elastic_train.py", out=True, echo=False, independent=True,
    expect_failure=True, timeout=launch_timeout,
    cues=[(lambda: len(starts()) == 3 and trained(now_log(), 2 * nproc_per_node) >= 10,
           lambda: (mark("cable pulled"), cluster.set_link("nodeB", False)),
           "nodeB's cable pulled"),
          (lambda: any(e.get("step") == steps for e in now_log()),
           lambda: cluster.set_link("nodeB", True), "nodeB's cable plugged back in")])
log = read_log("events")
print("exit status of each command:", events.exit_codes)
for e in log:
    if e.get("event"):
        print(f"{e['time'] - log[0]['time']:5.1f} s: a world of {e['world']} starts at step "
              f"{e['step']} (restart count {e['restart']})")
""")
code("""
worlds = [(e["world"], e["step"], e["restart"]) for e in log if e.get("event")]
back = [step for world, step, _ in worlds[2:3]]
assert not back or back[0] < steps - 10, \\
    f"nodeB came back at step {back[0]} of {steps}: too late for its cable to be pulled " \\
    "(a machine this busy needs more steps)"
assert [w for w, _, _ in worlds] == [4, 2, 4, 2], f"expected worlds of 4, 2, 4, 2: {worlds}"
assert events.exit_codes[:2] == [0, -9], \\
    f"expected nodeA's job done and nodeB's agent killed: {events.exit_codes}"
# the restart count: failures add one (the death, the cable), a host that joins does not
assert [r for _, _, r in worlds] == [0, 1, 1, 2], f"expected restart counts 0, 1, 1, 2: {worlds}"
resumed = {e["step"]: e["loss"] for e in log if "loss" in e}
gap = max(abs(loss - plain_loss[step]) for step, loss in resumed.items())
assert sorted(resumed) == list(range(1, steps + 1)) and gap < 1e-12, \\
    f"expected every step's loss equal to the uninterrupted job's, got {gap:.1e} apart"
print(f"largest gap to the uninterrupted job's loss, over {len(resumed)} steps: {gap:.1e}")
""", tags=["check"])
code("""
died = min(e["time"] for e in log if e.get("step") == leave_at)  # its last step done
events_at = {"nodeB dies": died - log[0]["time"],
             "cable pulled": moments["cable pulled"] - log[0]["time"]}
elastic_timeline(log, plain_loss, events_at);
""", alt="Two panels. Top: the number of ranks training over wall-clock seconds: 4, then 2 after nodeB dies, 4 again when it returns, 2 after its cable is pulled, with each event marked. Bottom: the loss per global step of this job drawn over the uninterrupted job's curve: the two coincide.")
md("""
## 3. What each event cost, and what counts as a restart

The shaded spans in the timeline are the seconds each event cost (this run's; they vary from run to run, and the cable's 5 s and 4 s overlap):

- **A host dies** (its processes gone, so its peers' sockets close at once): nodeA's ranks fail on their next all-reduce, its agent stops them and rendezvous again. A host counts as gone only when its last heartbeat is older than `keep_alive_interval` x `keep_alive_max_attempt` (1 s x 4 here, 15 s by default); until then the new round waits for it, as it is still listed in the last one. Then `last_call_timeout` (1 s), new workers, and the checkpoint's load.
- **A host comes back**: its agent joins the rendezvous's wait list; the running agent sees a node waiting in its monitor loop (it looks every 0.1 s, at a copy of the rendezvous refreshed every second) and restarts its workers in a world of 4. The world of 2 trains on until then.
- **A cable is pulled** (silence, not a closed socket): the ranks on both sides wait for the all-reduce's `--timeout` (5 s) before they fail; then the same wait for the silent host's heartbeat. The silent host's agent waits on the store it cannot reach (up to the store's `read_timeout`, 60 s by default); plugged back in after the job, it fails at once.

<details><summary>Deep dive: which restarts count against --max-restarts (torch 2.13's sources)</summary>

In `torch/distributed/elastic/agent/server/api.py`, `_invoke_run`: a worker group that FAILED uses up one of `--max-restarts` (`self._remaining_restarts -= 1`, then `_restart_workers`); when none are left, the agent stops and the job fails. A HEALTHY group with `num_nodes_waiting() > 0` restarts without counting ("membership changes do not count as retries"). `TORCHELASTIC_RESTART_COUNT`, which the workers see, is their agent's `max_restarts - remaining_restarts`: each agent counts its own. Rank 0 is on nodeA (the first host name in order), so the log's `restart` is nodeA's: 0, 1, 1, 2; the returning nodeB's workers saw 0. A host that joins is free, but one that leaves is not: the survivors' workers fail, and that costs each of their agents a restart. With `--max-restarts=3`, a fourth departure ends this job.

</details>

<details><summary>Deep dive: why keep_alive_max_attempt=4, not 2</summary>

If the limit is too short, a healthy host looks dead, and the job splits in two. In steady state an agent writes a heartbeat every interval, but each rendezvous stops and restarts its heartbeat timer, and an agent waiting in a round looks only once a second (`next_rendezvous` and `_should_keep_alive` in `dynamic_rendezvous.py`): right after a round, a live host's heartbeat can be 2 s old. That is exactly when a returning host arrives. With 1 s x 2, its agent took the running host for dead, dropped it, and made a world of its own: two jobs of 2 ranks each, writing the same checkpoints. 1 s x 4 held in every run, also with both cores kept busy.

</details>

<details><summary>Deep dive: what elastic torchrun does not do</summary>

It restarts whole worlds: every rank starts again from the newest checkpoint, and the steps since are done twice. It keeps nothing of a rank's memory across a restart (the data loader's position, compiled graphs, caches). It does not survive losing the host of the rendezvous endpoint (here nodeA): with the c10d backend, the store lives in that host's agent. And this lesson's costs are Gloo's on CPUs: under NCCL a dead peer does not close a socket, so the survivors wait for NCCL's watchdog, and sums in other orders are not bit-for-bit the same on GPUs. Keeping a step going when one replica fails, without restarting the others, is what torchft (PyTorch's fault-tolerant DDP and HSDP) does: replica groups that leave and join between steps, with a lighthouse server deciding the quorum of each step.

</details>
""")
md("""
## Summary

- Elastic torchrun (`--nnodes=1:2`) restarts the workers in a smaller world when a host leaves, and in a larger one when a host waits to join; the script must resume from a checkpoint any world can load.
- A step stays a step when the global batch and each step's samples do not depend on the world size: the loss curve then continues the uninterrupted one exactly.

## Exercises

**Exercise 1.** Write `batch_plan(global_batch, world_size, max_micro)`: the micro-batch size and the number of micro-batches each rank accumulates, `(micro, accumulate)`, so that `world_size` ranks together take exactly `global_batch` samples per step, in micro-batches of one size, at most `max_micro` samples, and as few accumulation steps as that allows (the script's `plan_batches` is the special case of a fixed micro-batch). Where no such plan exists (the ranks cannot share the batch evenly), raise a `ValueError` that says so.
""")
code("""
# STUB: def batch_plan(global_batch, world_size, max_micro):
# STUB:     return global_batch // world_size, 1  # one micro-batch per rank: right at 4 ranks
### BEGIN SOLUTION
def batch_plan(global_batch, world_size, max_micro):
    if global_batch % world_size:
        raise ValueError(f"{world_size} ranks cannot share a global batch of {global_batch}")
    per_rank = global_batch // world_size
    accumulate = next(a for a in range(1, per_rank + 1)
                      if per_rank % a == 0 and per_rank // a <= max_micro)
    return per_rank // accumulate, accumulate
### END SOLUTION
""", tags=["solution"])
code("""
plans = [((64, 4, 16), (16, 1)), ((64, 2, 16), (16, 2)), ((64, 1, 16), (16, 4)),
         ((40, 4, 16), (10, 1))]
for args, expected in plans:
    assert batch_plan(*args) == expected, \\
        f"batch_plan{args}: expected {expected}, got {batch_plan(*args)}"
for world in (2, 4):  # the worlds the job above trained in: 64 samples a step each
    micro, accumulate = batch_plan(64, world, 16)
    assert micro <= 16 and micro * accumulate * world == 64, \\
        f"{world} ranks: {micro} x {accumulate} x {world} samples, not 64"
""", tags=["check"])
code("""
# Hidden: a micro-batch that must shrink (96 samples on 6 ranks, at most 10: 8 x 2), and a
# world that cannot share the batch (64 on 3 ranks) must say so, not drop samples.
got = batch_plan(96, 6, 10)
assert got == (8, 2), f"batch_plan(96, 6, 10): expected (8, 2), got {got}"
try:
    got = batch_plan(64, 3, 16)
except ValueError:
    pass
else:
    raise AssertionError(f"batch_plan(64, 3, 16): expected a ValueError, got {got}")
""", tags=["hidden"])
cells.append(new_raw_cell("""Near miss: the largest micro-batch that fits, whatever it leaves over (96 on 6 ranks at most 10: 10 x 1, 60 samples).
-     if global_batch % world_size:
-         raise ValueError(f"{world_size} ranks cannot share a global batch of {global_batch}")
-     per_rank = global_batch // world_size
-     accumulate = next(a for a in range(1, per_rank + 1)
-                       if per_rank % a == 0 and per_rank // a <= max_micro)
-     return per_rank // accumulate, accumulate
+     micro = min(max_micro, global_batch // world_size)
+     return micro, global_batch // (micro * world_size)""", metadata={"tags": ["near-miss"]}))
md("""
**Exercise 2.** Write `steps_redone(save_every, failed_after)`: how many steps a job does twice when it fails after finishing step `failed_after`, with a checkpoint saved after every `save_every` steps (after steps `save_every`, `2 * save_every`, ...). The check compares it with section 2's run: nodeB died after step 20, with a checkpoint every 3 steps.
""")
code("""
# STUB: def steps_redone(save_every, failed_after):
# STUB:     return 0  # as if every step were saved
### BEGIN SOLUTION
def steps_redone(save_every, failed_after):
    return failed_after % save_every  # the steps since the newest checkpoint
### END SOLUTION
""", tags=["solution"])
code("""
resumed_at = worlds[1][1]  # where the world of 2 started: the newest checkpoint then
got = steps_redone(3, leave_at)
assert got == leave_at - resumed_at, \\
    f"steps_redone(3, {leave_at}): expected {leave_at - resumed_at} (the run resumed at step " \\
    f"{resumed_at}), got {got}"
""", tags=["check"])
code("""
# Hidden: a failure right after a checkpoint redoes nothing, and other intervals.
for args, expected in [((5, 25), 0), ((5, 24), 4), ((10, 3), 3), ((1, 7), 0)]:
    got = steps_redone(*args)
    assert got == expected, f"steps_redone{args}: expected {expected}, got {got}"
""", tags=["hidden"])
cells.append(new_raw_cell("""Near miss: a failure right after a checkpoint counted as a whole interval redone (right at step 20 of 3, wrong at 25 of 5).
-     return failed_after % save_every  # the steps since the newest checkpoint
+     return failed_after % save_every or save_every""", metadata={"tags": ["near-miss"]}))
md("**Next:**")
nb = new_notebook(cells=cells, metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}, "language_info": {"name": "python"}})
nbformat.write(nb, "notebooks/26_elastic.ipynb")
print("written", len(cells))
