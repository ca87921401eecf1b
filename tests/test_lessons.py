"""The lesson registry (tools/lessons.py) is where a lesson's facts live: every notebook is
in it once, and what is made from it (the map, the README's table, each lesson's Next line,
the site's descriptions, bench's budgets, the world-size runs) is what it says today."""
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

from tools import bench, course_map, site
from tools import lessons as registry
from tools.course import NOTEBOOKS, REPO, lessons, title
from tools.exercises import written_scripts

STEMS = [lesson.stem for lesson in registry.LESSONS]
SCRIPTS = REPO / "ddp_scripts"


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


PART_TENS = {part: i for i, part in enumerate(dict.fromkeys(
    lesson.part for lesson in registry.LESSONS))}  # the core path 0, the topics' parts 1, 2, ...


def test_the_file_names_sort_in_reading_order_with_a_number_each():
    assert STEMS == sorted(STEMS), (
        "the notebooks' file names must sort in the registry's order (JupyterLab and the site "
        f"list them by name): {STEMS}")
    numbers = [stem[:2] for stem in STEMS]
    assert len(set(numbers)) == len(numbers), f"a number is used twice: {numbers}"
    for lesson in registry.LESSONS:
        tens = PART_TENS[lesson.part]
        assert int(lesson.stem[:2]) // 10 == tens, (
            f"{lesson.stem}: a lesson of part {lesson.part!r} is numbered {tens}0 to {tens}9")


@pytest.mark.parametrize("lesson", registry.LESSONS, ids=lambda lesson: lesson.stem)
def test_the_title_carries_the_file_number(lesson):
    found = title(nbformat.read(NOTEBOOKS / f"{lesson.stem}.ipynb", as_version=4))
    assert found.startswith(f"{lesson.stem[:2]} · "), (
        f"{lesson.stem}'s title is {found!r}: it should begin {lesson.stem[:2]} · ")


@pytest.mark.parametrize("lesson", registry.LESSONS, ids=lambda lesson: lesson.stem)
def test_a_lesson_writes_into_its_folder_and_shared_what_the_registry_says(lesson):
    path = NOTEBOOKS / f"{lesson.stem}.ipynb"
    written = written_scripts(nbformat.read(path, as_version=4), NOTEBOOKS)
    folders = {target.parent.relative_to(SCRIPTS).as_posix() for target in written}
    assert folders <= {lesson.stem, "shared"}, (
        f"{lesson.stem} writes into ddp_scripts/{sorted(folders)}: its scripts go into "
        f"ddp_scripts/{lesson.stem}/, the modules other lessons import into ddp_scripts/shared/")
    shared = {target.name for target in written if target.parent.name == "shared"}
    assert shared == set(lesson.shared), (
        f"{lesson.stem} writes {sorted(shared)} into ddp_scripts/shared/; tools/lessons.py "
        f"says shared={lesson.shared}")


def imports(path: Path) -> set[str]:
    return set(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(), re.M))


def test_a_shared_module_is_one_another_lesson_imports():
    owner = {name[:-3]: lesson.stem for lesson in registry.LESSONS for name in lesson.shared}
    used_by: dict[str, set[str]] = {name: set() for name in owner}
    for script in SCRIPTS.glob("[0-9][0-9]_*/*.py"):
        for name in imports(script) & set(owner):
            used_by[name].add(script.parent.name)
    for name, stem in owner.items():
        assert used_by[name] - {stem}, (
            f"ddp_scripts/shared/{name}.py is imported by {sorted(used_by[name])} only: move it "
            f"into ddp_scripts/{stem}/ and out of shared= in tools/lessons.py")


def test_ddp_scripts_holds_a_folder_per_lesson_and_shared_nothing_else():
    entries = sorted(p.name for p in SCRIPTS.iterdir() if p.name != "__pycache__")
    assert entries == sorted([*STEMS, "shared"]), (
        f"ddp_scripts/ holds {entries}: a folder per lesson (its stem) and shared/, no loose "
        "files")


def test_no_script_takes_the_name_of_a_module_it_could_hide():
    """A script's folder comes first on its sys.path: a file there named like a module
    (the standard library's, an installed package's, a shared one) would be imported instead
    of it, by the script and by torch. And one name, one file: a name says which script."""
    names = [p for p in SCRIPTS.rglob("*.py") if "__pycache__" not in p.parts]
    stems = [p.stem for p in names]
    assert len(set(stems)) == len(stems), (
        f"two files share a name: {sorted({s for s in stems if stems.count(s) > 1})}")
    shared = {p.stem for p in (SCRIPTS / "shared").glob("*.py")}
    hidden = []
    for path in names:
        if path.parent.name == "shared":
            continue
        if path.stem in shared or path.stem in sys.stdlib_module_names:
            hidden.append(path)
            continue
        spec = importlib.util.find_spec(path.stem)
        if spec is not None:
            hidden.append(path)
    assert not hidden, f"named like a module they would hide: {hidden}"


def test_the_environment_imports_this_checkouts_modules():
    import ddp_common

    import tools

    expected = {"ddp_common": SCRIPTS / "shared" / "ddp_common.py",
                "tools": REPO / "tools" / "__init__.py"}
    for module in (ddp_common, tools):
        assert Path(module.__file__).resolve() == expected[module.__name__].resolve(), (
            f"{module.__name__} comes from {module.__file__}, not this checkout: .venv was made "
            "by another checkout (run `make venv` here)")


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
