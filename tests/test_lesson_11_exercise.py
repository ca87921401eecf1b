"""Lesson 11, exercise 4 (ddp_scripts/11_backends/mean_exercise.py): the trap the lesson
names. Without copy=True, tensor.to(torch.float64) returns a float64 input itself, so the in-place
all-reduce overwrites the caller's tensor; the other dtypes get a copy and are kept."""
from tools.launch import REPO, launch

SCRIPT = REPO / "ddp_scripts" / "11_backends/mean_exercise.py"
COPY = "tensor.to(torch.float64, copy=True)"


def test_to_without_copy_changes_a_float64_input(scripts_dir):
    source = SCRIPT.read_text()
    assert source.count(COPY) == 1
    script = scripts_dir / SCRIPT.name
    script.write_text(source.replace(COPY, "tensor.to(torch.float64)"))
    ranks = launch(str(script), nproc=2, out=True, timeout=60, echo=False).data["ranks"]
    for means in ranks:
        assert {dtype: found["input_kept"] for dtype, found in means.items()} == {
            "torch.float32": True, "torch.float64": False, "torch.int32": True,
            "torch.int64": True}
        assert all(found["mean"] == [1.5, 2.5, 3.5] for found in means.values())  # right
