"""Every lesson executes under papermill, and every exercise's check passes on its
solution and fails on its stub; its hidden checks pass on the solution, and each near miss
passes the visible check and fails a hidden one (one execution of the proof version proves
all of it); each but the two on the course's plumbing shows a figure drawn from its own run,
and none leaves a temporary folder."""
import re
import tempfile
from pathlib import Path

import nbformat
import pytest

from tools.course import execute, lessons, why_not_here
from tools.exercises import exercise_list, proof_version

# The lessons on the course's plumbing (how a launch works, devices) draw no figure.
NO_FIGURE = {"01_how_the_course_works", "02_devices"}


def temporary_folders() -> set[str]:
    """The folders lessons make in the temporary directory (`ddp-course-07-...`: a
    lesson's checkpoints, rendezvous files, TensorBoard logs). Not the launcher's own
    (removed by its `finally`, and made by any course run on the machine at the time)."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("ddp-course-*")
            if re.match(r"ddp-course-(\d\d|tensorboard)-", p.name)}


@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.stem)
def test_lesson_executes_and_every_check_can_fail(path, workspace, tmp_path):
    reason = why_not_here(path)
    if reason:
        pytest.skip(f"{path.stem} cannot run here: {reason}")
    nb = nbformat.read(path, as_version=4)
    executed_path = tmp_path / path.name
    before = temporary_folders()
    execute(proof_version(nb), executed_path, workspace, world_size=2)
    left = temporary_folders() - before
    assert not left, f"{path.stem} left temporary folders behind: {sorted(left)}"

    executed = nbformat.read(executed_path, as_version=4)
    proof_output = "".join(
        output.get("text", "")
        for cell in executed.cells if "exercise-proof" in cell.metadata.get("tags", [])
        for output in cell.get("outputs", []))
    for ex in exercise_list(nb):
        n = ex.number
        assert f"exercise {n}: the stub fails its check" in proof_output
        assert proof_output.count(f"exercise {n}: hidden check passes") == len(ex.hidden)
        for k in range(1, len(ex.near_misses) + 1):
            assert f"exercise {n}: near miss {k} passes the visible check" in proof_output
            assert f"exercise {n}: near miss {k} fails a hidden check:" in proof_output
    if path.stem not in NO_FIGURE:  # each lesson draws a figure from its own run
        figures = [output for cell in executed.cells for output in cell.get("outputs", [])
                   if "image/png" in output.get("data", {})]
        assert figures, (f"{path.stem} drew no figure from its run: plot what a run measured "
                         "(tools/plots.py has the course's plots; CONTRIBUTING.md, step 1)")
