"""The lessons whose claims depend on how the work divides among ranks, again at the other
world sizes lesson 00 invites (`make course WORLD_SIZE=3`, `WORLD_SIZE=4`): 3 ranks, where
chunks, shards and batches do not split evenly and the processes outnumber this machine's
2 cores; and 4, for the lessons whose structure changes there (a 2 x 2 grid of pipeline
stages and data-parallel groups, the quick start's invitation, two stragglers among four
ranks and Join's shadow collectives for three early finishers, and four ranks' loader
workers and distributed-checkpoint shards). Lessons 21 and 22 were left at 3
while the suite had no room (the capstone needed their 85 s); warm launches
(tools/zygote.py) paid for them again. (Every lesson runs at world size 2, the default,
in test_notebooks.py together with the exercise proofs.)

An exercise with a hidden check is left out here: the proof in test_notebooks.py already
runs its solution at the world size the hidden check sets (3, or 4) and its near miss.

The other lessons check things a world size does not change (how a launch reports a
failure, devices, a backend's bandwidth and DDP's bucket cut, how processes find each
other or fail to, restarts and their store, several hosts and Slurm, which fix their own
process counts): running them three times cost about 7 minutes of the suite's 35; running
the two lessons below at 4 as well as 3, about a minute more."""
import nbformat
import pytest

from tools import lessons as registry
from tools.course import NOTEBOOKS, execute, lessons, why_not_here
from tools.exercises import exercise_list

# stem: what changes with the world size (tools/lessons.py: each lesson's world_sizes)
DEPENDS_ON_WORLD_SIZE = {lesson.stem: lesson.world_sizes[3] for lesson in registry.LESSONS
                         if 3 in lesson.world_sizes}
# the lessons that run at 4 as well as 3: what changes there
ALSO_AT_4 = {lesson.stem: lesson.world_sizes[4] for lesson in registry.LESSONS
             if 4 in lesson.world_sizes}


def test_the_list_names_lessons():
    assert set(DEPENDS_ON_WORLD_SIZE) <= {p.stem for p in lessons()}
    assert set(ALSO_AT_4) <= set(DEPENDS_ON_WORLD_SIZE), "a lesson checked at 4 is at 3 too"
    assert {n for lesson in registry.LESSONS for n in lesson.world_sizes} <= {3, 4}


def without_proven_exercises(nb):
    """The lesson without the exercises that have a hidden check (proven elsewhere)."""
    drop = {i for ex in exercise_list(nb) if ex.hidden
            for i in [ex.solution, *ex.checks, *ex.hidden, *ex.near_misses]}
    nb.cells = [c for i, c in enumerate(nb.cells) if i not in drop]
    return nb


@pytest.mark.parametrize("stem, world_size",
                         [(stem, 3) for stem in sorted(DEPENDS_ON_WORLD_SIZE)]
                         + [(stem, 4) for stem in sorted(ALSO_AT_4)])
def test_lesson_passes_its_checks_at_world_size(stem, world_size, workspace, tmp_path):
    path = NOTEBOOKS / f"{stem}.ipynb"
    reason = why_not_here(path)
    if reason:
        pytest.skip(f"{path.stem} cannot run here: {reason}")
    nb = without_proven_exercises(nbformat.read(path, as_version=4))
    out = tmp_path / path.name
    execute(nb, out, workspace, world_size=world_size)
    executed = nbformat.read(out, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)  # every cell ran, none skipped
