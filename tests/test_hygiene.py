"""What a lesson must look like: stored clean, parameterised, its scripts committed
exactly as the notebook writes them, its images and links resolving, lint-free."""
import functools
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from tools import zygote
from tools.constant_checks import constant_asserts
from tools.course import (
    MAX_MAIN_PATH_WORDS,
    MAX_RESULT_DISTANCE,
    NOTEBOOKS,
    REPO,
    companion_scripts,
    lessons,
    main_path_words,
    result_distances,
)
from tools.diagrams import ALT_TEXT
from tools.exercises import written_scripts
from tools.launch import launch_environment

LESSONS = lessons()
SCRIPTS = companion_scripts()
MAX_CODE_CELL_LINES = 80
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def read(path):
    return nbformat.read(path, as_version=4)


def test_there_are_lessons_and_scripts():
    assert len(LESSONS) >= 2 and len(SCRIPTS) >= 2


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    for cell in read(path).cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_parameters_cell_has_the_ci_defaults(path):
    cells = [c for c in read(path).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1
    namespace = {}
    exec(cells[0].source, namespace)
    assert namespace["world_size"] == 2


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_structure(path):
    nb = read(path)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert re.match(rf"# {path.name[:2]} · ", nb.cells[0].source), "title: '# NN · Name'"
    required = ("**What you will learn**", "**Prerequisites**", "## Summary", "## Exercises",
                "**Next:**")
    missing = [part for part in required if part not in markdown]
    assert not missing, (f"missing {missing}: every lesson has each of {list(required)} "
                         "(CONTRIBUTING.md, step 1)")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_main_path_is_short(path):
    """Internals, histories and workaround mechanics fold into <details> deep dives; what
    a reader sees unfolded stays short (fenced code not counted)."""
    words = main_path_words(read(path))
    assert words <= MAX_MAIN_PATH_WORDS, \
        f"{words} words of prose outside <details> (at most {MAX_MAIN_PATH_WORDS}): fold more"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_prose_names_no_test_file(path):
    """A lesson teaches from its own cells; the test suite is not reading for learners."""
    markdown = "\n".join(c.source for c in read(path).cells if c.cell_type == "markdown")
    found = re.findall(r"tests/[\w./-]*", markdown)
    assert not found, f"prose names test files: {sorted(set(found))}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_deep_dives_are_well_formed(path):
    """Every <details> has a <summary> line and is closed in the same cell (JupyterLab
    and the site both fold it then)."""
    for cell in read(path).cells:
        if cell.cell_type != "markdown":
            continue
        opened, closed = cell.source.count("<details>"), cell.source.count("</details>")
        assert opened == closed, f"unbalanced <details> in: {cell.source[:80]}"
        for block in re.findall(r"<details>(.*?)</details>", cell.source, flags=re.S):
            assert re.match(r"\s*<summary>.+?</summary>", block, flags=re.S), block[:80]


def test_a_file_written_in_several_cells_counts_from_its_last():
    """Cells that write one file one after the other are one piece of code; a file written
    by one cell and prose after it is not."""
    cells = [nbformat.v4.new_code_cell(src) for src in (
        "%%writefile ../a.py\nx = 1", "%%writefile -a ../a.py\ny = 2",
        "%%writefile -a ../a.py\nz = 3")]
    cells += [nbformat.v4.new_markdown_cell("prose"),
              nbformat.v4.new_code_cell('r = launch("a.py")'),
              nbformat.v4.new_code_cell("assert r.ok")]
    assert result_distances(nbformat.v4.new_notebook(cells=cells)) == [(0, 3), (1, 3), (2, 3)]
    cells = [nbformat.v4.new_code_cell("%%writefile ../b.py\nx = 1"),
             *[nbformat.v4.new_markdown_cell("prose")] * 3, *cells[-2:]]
    assert result_distances(nbformat.v4.new_notebook(cells=cells)) == [(0, 5)]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_results_beside_their_code(path):
    """Every piece of a script is launched and its run checked at most
    MAX_RESULT_DISTANCE cells later: one launch per section, not one per lesson."""
    far = [(cell, distance) for cell, distance in result_distances(read(path))
           if distance is None or distance > MAX_RESULT_DISTANCE]
    assert not far, (f"(cell, cells to the first check of its run) farther than "
                     f"{MAX_RESULT_DISTANCE}: {far}")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_writefile_cells_match_committed_scripts(path):
    for target, (text, _) in written_scripts(read(path), NOTEBOOKS).items():
        assert target.is_file(), (f"{target.name} is not committed: run `python -m "
                                  "tools.course_map --write` and commit it")
        assert target.read_text().rstrip("\n") == text.rstrip("\n"), \
            f"{target.name} differs from the cells that write it: `python -m " \
            "tools.course_map --write`"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_code_sits_in_short_cells(path):
    """A script is written in pieces beside the prose that explains them (%%writefile -a),
    so no code cell is longer than a screen or two."""
    longest = max((c for c in read(path).cells if c.cell_type == "code"),
                  key=lambda c: len(c.source.splitlines()))
    assert len(longest.source.splitlines()) <= MAX_CODE_CELL_LINES, longest.source[:80]


def test_every_file_in_ddp_scripts_is_written_by_a_lesson():
    written = {target for path in LESSONS for target in written_scripts(read(path), NOTEBOOKS)}
    files = {p for p in (REPO / "ddp_scripts").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert files <= written, f"written by no lesson: {sorted(files - written)}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_links_and_images_resolve_and_images_have_alt_text(path):
    for cell in read(path).cells:
        if cell.cell_type != "markdown":
            continue
        for bang, text, target in LINK.findall(cell.source):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            assert (NOTEBOOKS / target.split("#")[0]).exists(), f"broken link {target}"
            if bang:
                name = Path(target).name
                assert text.strip(), f"image {target} has no alt text"
                if name in ALT_TEXT:
                    assert text == ALT_TEXT[name], f"alt text of {name} differs from diagrams.py"


# Scripts that are one plain process on purpose: the baselines before DDP (lessons 00, 40),
# and the capstone's model and data, each of which shows what it holds when run on its own.
ONE_PROCESS_SCRIPTS = {"00_ddp_in_ten_minutes/train_plain.py", "40_capstone_gpt/gpt_plain.py",
                       "40_capstone_gpt/gpt.py", "40_capstone_gpt/gpt_data.py"}


def needs_torchrun(script: Path) -> bool:
    return script.relative_to(REPO / "ddp_scripts").as_posix() not in ONE_PROCESS_SCRIPTS

RUNS = [(s, ("--help",)) for s in SCRIPTS] + \
    [(s, ()) for s in SCRIPTS if needs_torchrun(s)]


def plain_run(script, args, warm):
    """`python SCRIPT ARGS` without torchrun's variables: a new interpreter (cold), or one
    forked from the warm launcher's server (tools/zygote.py), which has imported torch
    already; None where no warm one can be used."""
    env = launch_environment()  # this process's environment less a launcher's variables
    if warm:
        return zygote.run_script(script, args, os.getcwd(), env, timeout=120)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=120, env=env)


@functools.cache
def plain_runs() -> dict:
    """Every script started by plain python: with --help, and with no arguments. A cold run
    is mostly torch's import (about 2 s, 100 s for them all on 2 cores), so they run warm
    where they can (test_a_warm_plain_run_is_a_cold_one), as many at a time as there are
    cores."""
    def run(job):
        return plain_run(*job, warm=True) or plain_run(*job, warm=False)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(RUNS, pool.map(run, RUNS)))


@pytest.mark.skipif(not zygote.usable(), reason="no warm interpreter here: every run is cold")
@pytest.mark.parametrize("args", [("--help",), ()], ids=["help", "no-arguments"])
def test_a_warm_plain_run_is_a_cold_one(args):
    script = REPO / "ddp_scripts" / "03_ddp_training/ddp_training.py"
    warm, cold = plain_run(script, args, warm=True), plain_run(script, args, warm=False)
    assert warm is not None
    assert (warm.returncode, warm.stdout, warm.stderr) == \
        (cold.returncode, cold.stdout, cold.stderr)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_answers_help_without_torchrun(script):
    done = plain_runs()[(script, ("--help",))]
    assert done.returncode == 0 and "usage:" in done.stdout and "--out" in done.stdout


@pytest.mark.parametrize("script", [s for s in SCRIPTS if needs_torchrun(s)],
                         ids=lambda p: p.stem)
def test_script_without_torchrun_says_how_to_launch_it(script):
    done = plain_runs()[(script, ())]
    assert done.returncode != 0
    # torchrun, or for the script of a job that Slurm starts (lesson 20's exercise) srun
    assert re.search(r"start it with (torchrun|srun)", done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_ruff_is_clean():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "notebooks", "ddp_scripts",
                           "tools", "tests"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_check_asserts_only_constants(path):
    """A check reads what a run produced: an assert on literals, the parameters or arithmetic
    on them holds whatever the run did (tools/constant_checks.py says how names are
    followed). One that is arithmetic on purpose says so on its line."""
    found = constant_asserts(read(path))
    assert not found, (
        f"{path.stem}: asserts that read only constants (cell, line): {found}. Check what the "
        "run produced instead, or say on the line why it is arithmetic (# arithmetic: ...)")


@pytest.mark.parametrize("path", lessons(), ids=lambda p: p.stem)
def test_every_check_says_what_it_expected(path):
    """`make grade` shows, for an assert that failed, its message's first line, then the
    values the assert compared (pytest's assertion rewriting): a message, where a check
    has one, is a sentence, not a tuple of values. And the exercise format holds (hidden
    checks and near misses right after their check)."""
    import ast

    from tools.exercises import exercise_list

    nb = nbformat.read(path, as_version=4)
    tuples = []
    for ex in exercise_list(nb):  # raises on a malformed exercise
        for index in ex.checks + ex.hidden:
            tree = ast.parse(nb.cells[index].source)
            tuples += [f"cell {index}, line {node.lineno}: {ast.unparse(node)[:70]}"
                       for node in ast.walk(tree)
                       if isinstance(node, ast.Assert) and isinstance(node.msg, ast.Tuple)]
    assert not tuples, "asserts whose message is a tuple:\n" + "\n".join(tuples)


def test_every_timing_check_is_guarded_or_decided(tmp_path):
    """A check that compares times runs only where its condition held (an `if` on the
    cores' shares, as lesson 00's) or is listed in tools/timing_checks.py with why it holds
    on a busy machine; a new unguarded one is found, not left to fail on a learner's laptop."""
    from tools import timing_checks

    assert not timing_checks.undecided(), (
        "checks that compare times, neither guarded nor decided (tools/timing_checks.py):\n"
        + "\n".join(timing_checks.undecided()))
    assert not timing_checks.stale(), f"decided, but gone: {timing_checks.stale()}"
    guarded = {stem for stem, _, guard in timing_checks.found() if guard}
    assert {"00_ddp_in_ten_minutes", "03_ddp_training", "40_capstone_gpt"} <= guarded
    lesson = tmp_path / "99_new.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'fast = run()\nassert fast["seconds"] < slow["seconds"]\nif min(shares) > 0.8:\n'
        '    assert fast["seconds"] < 2')]), lesson)
    assert timing_checks.undecided([lesson]) == [
        '99_new: assert fast["seconds"] < slow["seconds"]']
