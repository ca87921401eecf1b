"""Lesson 33's script beyond the lesson's defaults: three ranks, a smaller model."""

from tools.launch import launch


def test_scaling_script_on_three_ranks_records_every_measurement():
    data = launch("ddp_scripts/33_will_it_scale/scaling.py", "--width", "128", "--depth", "4",
                  "--rounds", "2",
                  "--caps", "0.05", "25", "--device", "cpu", nproc=3, out=True, timeout=120,
                  echo=False).data
    assert data["world_size"] == 3 and data["backend"] == "gloo"
    assert data["gradient_bytes"] == 4 * 4 * (128 * 128 + 128)
    assert len(data["rounds"]) == 2
    for row in data["rounds"]:
        assert [int(size) for size in row["all_reduce"]] == [1024 * 4 ** k for k in range(1, 8)]
        assert all(seconds > 0 for seconds in row["all_reduce"].values())
        assert len(row["plain"]["ready"]) == 8  # a weight and a bias per layer
        for cap, step in row["ddp"].items():
            assert sum(b["bytes"] for b in step["buckets"]) == data["gradient_bytes"], cap
            assert all(b["done"] >= b["at"] for b in step["buckets"]), cap
            assert {b["dtype"] for b in step["buckets"]} == {"torch.float32"}, cap
        assert len(row["ddp"]["0.05"]["buckets"]) == 4 and len(row["ddp"]["25.0"]["buckets"]) == 1
    assert set(data["logging"]) == {"0.05", "25.0"}
    assert data["cores"] >= 1
    assert [b["dtype"] for b in data["autocast_buckets"]] == ["torch.float32"]  # cap 25: one
