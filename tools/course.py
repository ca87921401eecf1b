"""What `make course`, `make student` and the tests share: the list of lessons, a
working copy of the course to execute in, and papermill's execution of one notebook."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
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


SCRIPTS = REPO / "ddp_scripts"  # a folder per lesson (its stem), and shared/


def companion_scripts(root: Path = SCRIPTS) -> list[Path]:
    """The scripts a learner launches: the Python files in the lessons' folders that run
    something when started (`if __name__ == "__main__":`); the others are modules their
    neighbours import (harnesses, helpers)."""
    return [path for path in sorted(root.glob("[0-9][0-9]_*/*.py"))
            if '__name__ == "__main__"' in path.read_text()]


def uses_cluster(nb) -> bool:
    """Whether a lesson builds lesson 32's hosts and Slurm (tools/cluster.py)."""
    return any("from tools import cluster" in cell.source
               for cell in nb.cells if cell.cell_type == "code")


def why_not_here(path: Path, nb=None) -> str | None:
    """Why lesson `path` cannot run on this machine, or None. Only a lesson that uses the
    cluster (lesson 32) can be refused: its hosts and Slurm need Linux and root. CI sets
    DDP_COURSE_REQUIRE_CLUSTER=1, so that there it always runs, and fails if it cannot."""
    if os.environ.get("DDP_COURSE_REQUIRE_CLUSTER") == "1":
        return None
    if not uses_cluster(nb if nb is not None else nbformat.read(path, as_version=4)):
        return None
    from tools import cluster
    return cluster.why_not()


MAX_MAIN_PATH_WORDS = 1500  # prose a lesson may hold outside its folded deep dives


def without_deep_dives(markdown: str) -> str:
    """A markdown cell as a reader sees it before unfolding: its `<details>` blocks out."""
    return re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)


MAP_HEADING = "## The course map"  # the first lesson's cell that tools/course_map.py writes
NEXT = "**Next:**"  # each lesson's closing line, which tools/course_map.py writes


def main_path_prose(nb) -> str:
    """A lesson's prose as a reader sees it unfolded: its markdown with the folded
    `<details>` blocks and the fenced code taken out."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not cell.source.startswith(MAP_HEADING):
            text = without_deep_dives(cell.source).split(NEXT)[0]  # made, not written
            parts.append(re.sub(r"```.*?```", "", text, flags=re.S))
    return "\n".join(parts)


def main_path_words(nb) -> int:
    """Words in main_path_prose, counted both ways a reader's tool might (runs of word
    characters, or whitespace-separated tokens, which count a table's `|` cells): the larger."""
    prose = main_path_prose(nb)
    return max(len(re.findall(r"\w+", prose)), len(prose.split()))


MAX_RESULT_DISTANCE = 3  # cells from a piece of a script to the check of its run

WRITES_SCRIPT = re.compile(r"%%writefile\b")
LAUNCHES = re.compile(r"\b(launch|launch_ranks|launch_nodes|launch_on|run_exercise|sbatch|srun)\(")
CHECKS = re.compile(r"^\s*assert\b", re.M)


def result_distances(nb) -> list[tuple[int, int | None]]:
    """For each code cell that writes a script or a piece of one (`%%writefile`), how many
    cells later (markdown counted) the first check of a run comes: the first code cell
    with an `assert` at or after the next launch, cells that write scripts skipped. None
    when no check follows. A figure or table of the run sits between them, so this is
    the distance from code to result that a reader scrolls. A file too long for one cell,
    written by cells one after the other (`%%writefile -a`), is one piece of code: the
    distance counts from its last cell."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not WRITES_SCRIPT.match(cell.source):
            continue
        end = i
        target = cell.source.split("\n", 1)[0].split()[-1]
        while end + 1 < len(nb.cells) and nb.cells[end + 1].cell_type == "code" and \
                nb.cells[end + 1].source.startswith(f"%%writefile -a {target}\n"):
            end += 1
        launched, distance = False, None
        for j in range(end + 1, len(nb.cells)):
            later = nb.cells[j]
            if later.cell_type != "code" or WRITES_SCRIPT.match(later.source):
                continue
            launched = launched or bool(LAUNCHES.search(later.source))
            if launched and CHECKS.search(later.source):
                distance = j - end
                break
        found.append((i, distance))
    return found


def title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "untitled"


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


KERNEL_FOLDER_PREFIX = "ddp-kernel-"


def remove_stale_kernel_folders(min_age_s: float = 600, tmp: Path | None = None) -> list[Path]:
    """Remove the socket folders of kernels that are gone (their run was killed before its
    `finally`): older than `min_age_s` (a kernel binds its sockets within seconds of its
    folder's creation) and with nothing listening on their first socket. Returns them."""
    import socket

    removed = []
    for folder in Path(tmp or tempfile.gettempdir()).glob(KERNEL_FOLDER_PREFIX + "*"):
        try:
            if time.time() - folder.stat().st_mtime < min_age_s:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(folder / "k-1"))  # a live kernel accepts: keep its folder
        except (ConnectionRefusedError, FileNotFoundError):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:
            pass  # not ours, or not readable: leave it
    return removed


def changed_parameters(nb, parameters: dict) -> dict:
    """The parameters whose values differ from the lesson's `parameters` cell: papermill adds
    a cell for them (none when nothing differs, so a default run's page shows the lesson's
    own cell once)."""
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    defaults: dict = {}
    if cells:
        exec(cells[0].source, defaults)
    return {k: v for k, v in parameters.items() if k not in defaults or defaults[k] != v}


def share_warm_server() -> None:
    """One warm server (tools/zygote.py) for every lesson this process executes: each
    lesson's kernel finds it through the environment, instead of starting its own and
    importing torch again (about 3 s a lesson on 2 cores)."""
    from tools import launch, zygote

    zygote.share(launch.launch_environment())


def execute(nb, out_path: Path, workspace: Path, world_size: int = DEFAULT_WORLD_SIZE,
            extra_parameters: dict | None = None) -> float:
    """Execute notebook `nb` (a NotebookNode) with papermill inside `workspace/notebooks`,
    write the executed copy to `out_path`, and return the seconds it took. Raises
    papermill's PapermillExecutionError (with the failing cell's traceback) on failure."""
    import papermill
    from traitlets.config import Config

    from tools.exercises import without_grading_cells
    from tools.launch import timeout_scale

    share_warm_server()
    nb = without_grading_cells(nb)  # hidden checks and near misses run only when grading
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    source = out_path.with_suffix(".input.ipynb")
    nbformat.write(nb, source)
    # The kernel talks to papermill over local (IPC) sockets rather than TCP: ipykernel 7.4
    # warns "Kernel is running over TCP without encryption" at every start over TCP. The
    # sockets and the connection file live in a folder of this run's own (its path is
    # absolute, so the kernel's working directory does not matter; two runs at once never
    # share one), removed afterwards even if the kernel died; folders left by a run that was
    # killed (no `finally`) are removed by the next run.
    remove_stale_kernel_folders()
    sockets = Path(tempfile.mkdtemp(prefix=KERNEL_FOLDER_PREFIX))
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(sockets / "k")  # sockets k-1 ... k-5
    config.KernelManager.connection_file = str(sockets / "kernel.json")
    # The kernel forked from a server that has made its imports (tools/warm_kernel.py)
    config.NotebookClient.kernel_manager_class = "tools.warm_kernel.WarmKernelManager"
    start = time.monotonic()
    try:
        papermill.execute_notebook(
            str(source), str(out_path), cwd=str(Path(workspace) / "notebooks"),
            parameters=changed_parameters(nb, {"world_size": world_size,
                                               **(extra_parameters or {})}),
            kernel_name="python3", execution_timeout=CELL_TIMEOUT_S * timeout_scale(),
            progress_bar=False, log_output=False, request_save_on_cell_execute=False,
            config=config)
    finally:
        source.unlink(missing_ok=True)
        shutil.rmtree(sockets, ignore_errors=True)
        if uses_cluster(nb):  # its hosts and Slurm, if its kernel died before removing them
            from tools import cluster
            if cluster.down_if_up():
                print(f"[course] {out_path.name}: removed the cluster its kernel left",
                      flush=True)
    return time.monotonic() - start
