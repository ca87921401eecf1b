"""The course map (tools/course_map.py) names every lesson once, has run seconds for each,
and the copies in the README and in the first lesson are what the module makes today."""
import nbformat
import pytest

from tools import course_map
from tools import lessons as registry
from tools.course import lessons


def test_every_lesson_is_on_the_map_once_with_its_seconds():
    assert course_map.check() == []
    assert sorted(course_map.stems_in_map()) == sorted(p.stem for p in lessons())


def test_a_lesson_left_out_of_the_registry_is_reported_with_where_to_add_it(monkeypatch):
    monkeypatch.setattr(registry, "LESSONS",
                        [lesson for lesson in registry.LESSONS if lesson.stem != "32_clusters"])
    assert any("32_clusters" in problem and "missing" in problem
               and "tools/lessons.py" in problem for problem in course_map.check())


def test_the_readme_shows_todays_map():
    readme = course_map.README.read_text()
    assert course_map.readme_text(readme) == readme, \
        "run `python -m tools.course_map --write` and commit the README"


def test_the_first_lesson_shows_todays_map():
    nb = nbformat.read(course_map.FIRST_LESSON, as_version=4)
    assert course_map.lesson_map_cell(nb).source == course_map.lesson_map_source(), \
        "run `python -m tools.course_map --write` and commit the lesson"


def test_the_first_lesson_reads_in_ten_minutes():
    nb = nbformat.read(course_map.FIRST_LESSON, as_version=4)
    assert course_map.reading_minutes(nb) <= 10


def test_reading_minutes_count_the_main_path_once():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[md("word " * 400)])
    assert course_map.reading_minutes(nb) == 2  # prose: 200 words a minute
    nb.cells.append(md("<details><summary>more</summary>\n\n" + "word " * 4000 + "</details>"))
    assert course_map.reading_minutes(nb) == 2  # a deep dive is not on the main path
    script = "\n".join(f"x{i} = {i}" for i in range(200))  # 400 words
    nb.cells.append(code(script))
    assert course_map.reading_minutes(nb) == 6  # code: 100 words a minute
    nb.cells.append(code(script))
    assert course_map.reading_minutes(nb) == 6  # shown again: read once
    plumbing = code("\n".join(f"z{i} = {i}" for i in range(500)))
    plumbing.metadata["jupyter"] = {"source_hidden": True}
    nb.cells.append(plumbing)
    assert course_map.reading_minutes(nb) == 6  # folded code is not on the main path
    nb.cells.append(md("## Exercises\n\n" + "word " * 1000))
    nb.cells.append(code("\n".join(f"y{i} = {i}" for i in range(500))))
    assert course_map.reading_minutes(nb) == 6  # exercises are work, not reading


def test_the_readme_figures_are_counted_from_the_notebooks():
    """A counted figure left stale is rewritten, and a figure the module does not count is
    an error, not a number kept by hand."""
    counted = course_map.figures()
    assert int(counted["lessons"]) == len(course_map.stems_in_map())
    assert float(counted["points"]) == float(counted["points-but-capstone"]) + float(
        counted["capstone-points"])
    stale = "<!-- figure: points -->7<!-- / --> points"
    assert course_map.with_figures(stale) == \
        f"<!-- figure: points -->{counted['points']}<!-- / --> points"
    with pytest.raises(KeyError, match="no figure named 'students'"):
        course_map.with_figures("<!-- figure: students -->3<!-- / -->")
