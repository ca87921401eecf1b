"""Every lesson at the other world sizes lesson 00 invites (`make course WORLD_SIZE=3`,
`WORLD_SIZE=4`): 3 ranks, where chunks and shards do not split evenly, and 4, more
processes than this machine has cores. The checks in the lessons must hold there too.
(World size 2, the default, runs in test_notebooks.py together with the exercise proofs.)"""
import nbformat
import pytest

from tools.course import execute, lessons, why_not_here


@pytest.mark.parametrize("world_size", [3, 4])
@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.stem)
def test_lesson_passes_its_checks_at_world_size(path, world_size, workspace, tmp_path):
    reason = why_not_here(path)
    if reason:
        pytest.skip(f"{path.stem} cannot run here: {reason}")
    nb = nbformat.read(path, as_version=4)
    out = tmp_path / path.name
    execute(nb, out, workspace, world_size=world_size)
    executed = nbformat.read(out, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)  # every cell ran, none skipped
