"""Lesson 10's ring all-reduce, held to numbers worked out by hand, at a world size the
lesson itself does not run (5 ranks, where the busiest rank sends one element more than
the lower bound), and measured by the kernel rather than by the script's own count."""
import os
import sys

import pytest

from tools.launch import cpu_unless_enough_gpus, launch

# 1003 = 201 + 201 + 201 + 200 + 200 (tensor_split). Rank r sends every chunk twice except
# chunk (r+1) % 5 in phase 1 and chunk (r+2) % 5 in phase 2: 2006 minus those two.
NUMEL, SENT = 1003, [2006 - 402, 2006 - 401, 2006 - 400, 2006 - 401, 2006 - 402]
KERNEL_COUNTS = sys.platform == "linux" and os.path.exists("/proc/self/io")


@pytest.fixture(scope="module")
def five_ranks():
    data = launch("ddp_scripts/10_collectives/ring.py", "--ring-sizes", "3", str(NUMEL),
                  "--timing-numel", str(NUMEL), "--repeats", "1", nproc=5, out=True,
                  env=cpu_unless_enough_gpus(5), timeout=180, echo=False).data
    return {**data["rings"][0], "backend": data["backend"]}  # the ring on all 5 ranks


def test_ring_is_right_with_empty_and_uneven_chunks(five_ranks):
    assert [(c["size"], c["equal"]) for c in five_ranks["ring_checks"]] == [(3, True),
                                                                          (NUMEL, True)]


def test_each_rank_sends_what_the_schedule_says(five_ranks):
    traffic = five_ranks["traffic"]
    assert [r["elements_sent"] for r in traffic["ranks"]] == SENT
    assert sum(SENT) == 2 * (5 - 1) * NUMEL  # the lower bound on the total, met exactly
    assert max(SENT) == -(-sum(SENT) // 5) + 1  # the busiest rank: one above the average


@pytest.mark.skipif(not KERNEL_COUNTS, reason="the kernel's byte count is Linux-only")
def test_the_kernel_saw_four_bytes_per_element_plus_equal_headers(five_ranks):
    if five_ranks["backend"] != "gloo":
        pytest.skip("only Gloo sends through sockets the kernel counts")
    traffic = five_ranks["traffic"]
    assert traffic["bytes_counted_by"] == "/proc/self/io wchar"
    extra = [r["ring_bytes"] - 4 * sent for r, sent in zip(traffic["ranks"], SENT)]
    assert len(set(extra)) == 1 and 0 <= extra[0] <= 1024 * 2 * (5 - 1), extra
    gloo = sum(r["all_reduce_bytes"] for r in traffic["ranks"])
    assert gloo >= 4 * 2 * (5 - 1) * NUMEL  # Gloo's all_reduce cannot beat the bound
