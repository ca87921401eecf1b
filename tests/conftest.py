import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.course import make_workspace  # noqa: E402


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """One copy of the course for the whole session: lessons execute there, never in
    the repository."""
    return make_workspace(tmp_path_factory.mktemp("course"))


# The lessons test_notebooks.py executed in this session (the executed notebook's bytes, by
# notebook stem), so that test_site.py renders and checks those pages instead of executing
# the course a second time.
EXECUTED_LESSONS = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if (call.when == "call" and report.passed and item.module.__name__.endswith("test_notebooks")
            and "tmp_path" in item.funcargs and hasattr(item, "callspec")):
        path = item.callspec.params.get("path")
        executed = item.funcargs["tmp_path"] / path.name if path is not None else None
        if executed is not None and executed.exists():
            item.config.stash.setdefault(EXECUTED_LESSONS, {})[path.stem] = executed.read_bytes()
    return report


@pytest.fixture(scope="session")
def executed_lessons(request) -> dict:
    """{notebook stem: executed notebook (bytes)}: the lessons executed so far."""
    return request.config.stash.setdefault(EXECUTED_LESSONS, {})


@pytest.fixture
def scripts_dir(tmp_path):
    """A folder for variants of a companion script (a typical wrong answer), holding the
    lesson modules the scripts import from their own folder (the exercises' harnesses, ...),
    as a script's lesson folder in ddp_scripts/ does; ddp_scripts/shared/ is importable from
    anywhere in .venv."""
    lesson_modules = {p.stem: p for p in (REPO / "ddp_scripts").glob("[0-9][0-9]_*/*.py")}
    imported = set()
    for path in lesson_modules.values():
        imported |= set(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(), re.M))
    for name in imported & set(lesson_modules):
        shutil.copy(lesson_modules[name], tmp_path / f"{name}.py")
    return tmp_path
