"""What `make course`, `make student` and the tests share: the list of lessons, a
working copy of the course to execute in, and papermill's execution of one notebook."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
# What a lesson needs around it when it runs: `../ddp_scripts`, `../tools`, `../images`.
COURSE_PARTS = ("notebooks", "ddp_scripts", "tools", "images")
CELL_TIMEOUT_S = 300  # a backstop per cell; every launch inside has its own, shorter timeout
DEFAULT_WORLD_SIZE = 2


def lessons() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "untitled"


def blurb(nb) -> str:
    """The first sentence of a lesson's introduction, for the index page."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for paragraph in cell.source.split("\n\n")[1:]:
                if paragraph.strip():
                    sentence = paragraph.strip().split(". ")[0].rstrip(".") + "."
                    return sentence.replace("**", "").replace("`", "")  # plain text
    return ""


def make_workspace(dest: Path) -> Path:
    """A fresh copy of the course to execute in, so that running never writes into the
    repository (the lessons rewrite their scripts with %%writefile when they run)."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for part in COURSE_PARTS:
        shutil.copytree(REPO / part, dest / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    return dest


def execute(nb, out_path: Path, workspace: Path, world_size: int = DEFAULT_WORLD_SIZE,
            extra_parameters: dict | None = None) -> float:
    """Execute notebook `nb` (a NotebookNode) with papermill inside `workspace/notebooks`,
    write the executed copy to `out_path`, and return the seconds it took. Raises
    papermill's PapermillExecutionError (with the failing cell's traceback) on failure."""
    import papermill

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    source = out_path.with_suffix(".input.ipynb")
    nbformat.write(nb, source)
    start = time.monotonic()
    try:
        papermill.execute_notebook(
            str(source), str(out_path), cwd=str(Path(workspace) / "notebooks"),
            parameters={"world_size": world_size, **(extra_parameters or {})},
            kernel_name="python3", execution_timeout=CELL_TIMEOUT_S,
            progress_bar=False, log_output=False, request_save_on_cell_execute=False)
    finally:
        source.unlink(missing_ok=True)
    return time.monotonic() - start
