"""Lesson 31's script (ddp_scripts/31_pipeline_ddp/pipeline_by_hand.py) needs two stages
with the same number of processes each: an odd number of processes is refused before anyone
joins a group, with a message that says what to use. Exercise 2's check (the GPipe step)
refuses a pipeline that is right but never overlaps its stages."""
import shutil

import nbformat
import pytest

from tools.course import NOTEBOOKS, REPO
from tools.launch import launch


def test_an_odd_number_of_processes_is_refused_clearly():
    result = launch("ddp_scripts/31_pipeline_ddp/pipeline_by_hand.py", nproc=3, timeout=90,
                    echo=False,
                    expect_failure=True)
    assert "2 stages need an even number of processes, not 3" in result.output
    assert "--nproc-per-node=4" in result.output


def test_exercise_2s_check_refuses_a_pipeline_whose_stages_never_overlap(tmp_path):
    """Stage 1 receiving every micro-batch before computing the first gives the right weights
    and the right number of sends and receives, but no overlap: the check must say so."""
    shutil.copytree(REPO / "ddp_scripts", tmp_path / "ddp_scripts")
    script = tmp_path / "ddp_scripts" / "31_pipeline_ddp/gpipe_exercise.py"
    solution = script.read_text()
    start = solution.index("        grads = []\n")
    end = solution.index("    ### END SOLUTION")
    serial = (
        "        pieces = [torch.empty(len(t), lesson.WIDTH, dtype=torch.float64)\n"
        "                  for t in y.chunk(micro)]\n"
        "        for h in pieces:  # every micro-batch first\n"
        "            dist.recv(h, partner)\n"
        "        for h, target in zip(pieces, y.chunk(micro)):\n"
        "            h.requires_grad_()\n"
        "            (F.mse_loss(model(h), target) / micro).backward()\n"
        "            dist.send(h.grad, partner)\n")
    script.write_text(solution[:start] + serial + solution[end:])
    result = launch("ddp_scripts/31_pipeline_ddp/gpipe_exercise.py", nproc=2, out=True, timeout=90,
                    echo=False, cwd=tmp_path)
    stage1 = result.data["ranks"][1]
    assert stage1["gap"] < 1e-12 and stage1["per_step"]["send"] == stage1["per_step"]["recv"] == 4
    assert stage1["order"][:5] == ["recv"] * 4 + ["forward"]
    nb = nbformat.read(NOTEBOOKS / "31_pipeline_ddp.ipynb", as_version=4)
    check = next(c.source for c in nb.cells if "check" in c.metadata.get("tags", [])
                 and "31_pipeline_ddp/gpipe_exercise.py" in c.source)
    with pytest.raises(AssertionError, match="stage 1 waited for every micro-batch"):
        exec(check, {"launch": lambda *args, **kwargs: result, "exercise_timeout": 90})
