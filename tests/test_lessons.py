"""The lesson registry (tools/lessons.py) is where a lesson's facts live: every notebook is
in it once, and what is made from it (the map, the README's table, each lesson's Next line,
the site's descriptions, bench's budgets, the world-size runs) is what it says today."""
import re

import nbformat
import pytest

from tools import bench, course_map, site
from tools import lessons as registry
from tools.course import NOTEBOOKS, lessons
from tools.exercises import written_scripts

STEMS = [lesson.stem for lesson in registry.LESSONS]


def test_every_notebook_is_in_the_registry_once():
    notebooks = sorted(p.stem for p in lessons())
    assert sorted(STEMS) == notebooks, (
        f"not in tools/lessons.py: {sorted(set(notebooks) - set(STEMS))} (add each to "
        f"LESSONS, in its part and reading order); no notebook: "
        f"{sorted(set(STEMS) - set(notebooks))}")
    assert len(set(STEMS)) == len(STEMS), "a lesson is in tools/lessons.py twice"


def test_the_core_path_comes_first_and_each_part_is_one_run_of_lessons():
    parts = [lesson.part for lesson in registry.LESSONS]
    assert parts[0] == registry.CORE
    runs = [part for i, part in enumerate(parts) if i == 0 or parts[i - 1] != part]
    assert len(runs) == len(set(runs)), f"a part is split: {runs}"


@pytest.mark.parametrize("lesson", registry.LESSONS, ids=lambda lesson: lesson.stem)
def test_helpers_are_the_modules_the_lesson_writes(lesson):
    path = NOTEBOOKS / f"{lesson.stem}.ipynb"
    written = {target.name for target in written_scripts(nbformat.read(path, as_version=4),
                                                         NOTEBOOKS)}
    modules = {name for name in written if not re.match(r"\d\d_", name)}
    assert modules == set(lesson.helpers), (
        f"{lesson.stem} writes {sorted(modules)}; tools/lessons.py says {lesson.helpers}")


@pytest.mark.parametrize("lesson", registry.LESSONS, ids=lambda lesson: lesson.stem)
def test_each_lesson_ends_with_the_next_line_of_the_reading_order(lesson):
    cell = course_map.next_cell(nbformat.read(NOTEBOOKS / f"{lesson.stem}.ipynb",
                                              as_version=4))
    assert cell.source.endswith(course_map.next_line(lesson.stem)), \
        "run `python -m tools.course_map --write` and commit the lessons"


def test_the_next_lines_follow_the_registry():
    assert course_map.next_line(STEMS[0]).count(f"({STEMS[1]}.ipynb)") == 1
    assert "last lesson" in course_map.next_line(STEMS[-1])
    first_topic = next(lesson for lesson in registry.LESSONS if lesson.part != registry.CORE)
    before = STEMS[STEMS.index(first_topic.stem) - 1]
    assert "core path" in course_map.next_line(before)
    assert first_topic.part in course_map.next_line(before)


def test_what_is_made_from_the_registry_says_what_it_says():
    assert site.DESCRIPTIONS == {lesson.stem: lesson.summary for lesson in registry.LESSONS}
    assert {stem: lesson.budget_s for stem, lesson in registry.by_stem().items()
            if lesson.budget_s != registry.LESSON_BUDGET_S} == bench.LESSON_BUDGETS_S
    assert [stem for stem, _ in course_map.core()] + [
        stem for _, rows in course_map.topics() for stem, _ in rows] == STEMS
    table = course_map.lessons_table()
    assert [m for m in re.findall(r"\(notebooks/(\w+)\.ipynb\)", table)] == STEMS
