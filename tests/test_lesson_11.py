"""Lesson 11 (backends): claims its checks rely on, tested where the lesson cannot.

The lesson runs its scripts once each, with the learner's environment and world size.
This test runs them with 3 ranks (so that algbw and busbw differ), the bandwidth script
with OMP_NUM_THREADS exported, as a learner's shell might (torchrun must keep that value,
and the lesson's check expects it rather than torchrun's default of 1), and the buckets
script as the lesson does: real DDP buckets, with bucket_cap_mb None and 25, at 3 ranks.
"""

import math
import operator
from functools import reduce

import torch
import torch.distributed as dist

from tools.launch import launch

CPU = {"CUDA_VISIBLE_DEVICES": ""}


def test_bandwidth_three_ranks_keep_an_exported_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    data = launch("ddp_scripts/11_backends/bandwidth.py", "--sizes", "1024", "65536",
                  "--seconds-per-size", "0.02", nproc=3, out=True, timeout=120,
                  echo=False, env=CPU).data
    assert data["environment"]["OMP_NUM_THREADS"] == "2"  # torchrun did not force 1
    assert data["threads"] == 2
    for r in data["rows"]:
        assert math.isclose(r["busbw"], r["algbw"] * 4 / 3)  # 2(n-1)/n with n = 3


def test_reduce_ops_on_three_ranks():
    data = launch("ddp_scripts/11_backends/backends.py", nproc=3, out=True, timeout=120, echo=False,
                  env=CPU).data
    values = [1, 2, 3]  # rank r holds r + 1
    ops = data["reduce_ops"]
    assert ops["SUM"]["int64"]["result"] == 6 and ops["PRODUCT"]["float32"]["result"] == 6
    assert ops["BOR"]["int64"]["result"] == reduce(operator.or_, values)
    assert ops["BXOR"]["int64"]["result"] == reduce(operator.xor, values)
    assert not ops["BAND"]["float32"]["ok"] and not ops["PREMUL_SUM"]["float32"]["ok"]
    if torch.__version__ >= "2.8":  # Gloo's AVG (pull request 149781)
        assert ops["AVG"]["float32"] == {"ok": True, "result": 2.0}
    assert not ops["AVG"]["int64"]["ok"]
    assert math.isclose(data["average_by_sum"], 2.0)


def test_ddp_buckets_on_three_ranks():
    data = launch("ddp_scripts/11_backends/why_buckets.py", nproc=3, out=True, timeout=120,
                  echo=False,
                  env=CPU).data
    assert set(data["bucketing"]) == {"one call per tensor", "one bucket"}
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    assert data["ddp_buckets"]["25"] == [sum(data["ddp_buckets"]["None"])]
    assert len(data["ddp_buckets"]["None"]) == 2  # 8 layers of 257 KiB: 4 + 4
    assert first <= data["ddp_buckets"]["None"][0] < 2 * first
