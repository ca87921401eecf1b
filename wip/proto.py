import json, shutil, sys, time, os
from pathlib import Path
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
from tools import cluster
print("up", cluster.up(with_slurm=False))
SCRIPT = "ddp_scripts/26_elastic/elastic_train.py"
STEPS = int(os.environ.get("STEPS", 200))
def torchrun(job, *extra, port=29400):
    return ["GLOO_SOCKET_IFNAME=eth0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun",
            "--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=nodeA:{port}", f"--rdzv-id={job}", "--max-restarts=3",
            "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=" + os.environ.get("KA", "4") + ",join_timeout=30,read_timeout=5",
            SCRIPT, "--dir", f"/tmp/el/{job}", "--steps", str(STEPS), "--timeout", "5", *extra]
def trained(log, world):
    count = 0
    for line in log.read_text().splitlines() if log.exists() else []:
        e = json.loads(line)
        if e.get("event") == "start":
            count = 0
        elif e["world"] == world:
            count += 1
    return count
try:
    for job in ("plain", "events"):
        shutil.rmtree(f"/tmp/el/{job}", ignore_errors=True)
    t = time.monotonic()
    plain = cluster.launch_on([("nodeA", torchrun("plain")), ("nodeB", torchrun("plain"))], SCRIPT, out=True, echo=False, timeout=120)
    print("plain", time.monotonic() - t, plain.data["world_size"], "warm", plain.warm)
    t = time.monotonic()
    log = Path("/tmp/el/events/steps.jsonl")
    base = torchrun("events", "--leave-at", "20")
    import threading
    marks = {}
    def watcher():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            lines = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
            starts = [e for e in lines if e.get("event") == "start"]
            if "unplug" not in marks and len(starts) >= 3 and starts[-1]["world"] == 4 and trained(log, 4) >= 30:
                cluster.set_link("nodeB", False); marks["unplug"] = time.time(); print("UNPLUGGED", flush=True)
            if "unplug" in marks and "replug" not in marks and any(e.get("step") == STEPS for e in lines):
                time.sleep(0.5)
                cluster.set_link("nodeB", True); marks["replug"] = time.time(); print("REPLUGGED", flush=True)
                return
            time.sleep(0.05)
    threading.Thread(target=watcher, daemon=True).start()
    ev = cluster.launch_on([("nodeA", base), ("nodeB", base), ("nodeB", base, lambda: trained(log, 2) >= 1)],
                           SCRIPT, out=True, echo=True, timeout=70, expect_failure=True, independent=True)
    print("events", time.monotonic() - t, ev.returncode, ev.exit_codes, "warm", ev.warm)
    from tools import zygote; print("why_cold", zygote.why_cold)
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    ref = {json.loads(l)["step"]: json.loads(l)["loss"] for l in Path("/tmp/el/plain/steps.jsonl").read_text().splitlines() if "loss" in l}
    t0 = lines[0]["time"]
    for e in lines:
        if "event" in e or e["step"] % 25 == 0:
            print(round(e["time"] - t0, 2), e, "diff", abs(e.get("loss", 0) - ref.get(e["step"], 0)) if "loss" in e else "")
    print("marks", {k: v - lines[0]["time"] for k, v in marks.items()})
    print("max diff", max(abs(e["loss"] - ref[e["step"]]) for e in lines if "loss" in e))
finally:
    cluster.down()
