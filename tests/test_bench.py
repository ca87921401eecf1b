"""`make bench` counts a lesson's launches from the commands the launchers echo."""
import nbformat

from tools.bench import builds_ddp, launch_floor, launched_scripts, launches, launches_in


def test_launches_are_counted_once_however_many_processes_they_start(tmp_path):
    nb = nbformat.v4.new_notebook()
    two_ranks = nbformat.v4.new_code_cell("launch_ranks(...)")
    two_ranks.outputs = [  # the kernel may split one cell's stream into several outputs
        nbformat.v4.new_output("stream", text="$ RANK=0 python a.py &\n"),
        nbformat.v4.new_output("stream", text="$ RANK=1 python a.py &\n[rank0]: hi\n"),
    ]
    torchrun_twice = nbformat.v4.new_code_cell("launch(...)")
    torchrun_twice.outputs = [nbformat.v4.new_output(
        "stream", text="$ torchrun b.py\n[default0]:hi\n$ torchrun c.py\n")]
    quiet = nbformat.v4.new_code_cell("print('$ not at the start of a line')")
    quiet.outputs = [nbformat.v4.new_output("stream", text="cost: $ 5\n")]
    nb.cells = [two_ranks, torchrun_twice, quiet]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    assert launches_in(path) == 3


def test_the_floor_knows_which_launches_build_a_ddp_model(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("launch(...)")
    cell.outputs = [nbformat.v4.new_output(
        "stream", text="$ torchrun --standalone --nproc-per-node=2 ddp_scripts/a.py "
                       "--out /tmp/x.json\n$ torchrun ddp_scripts/b.py\n"
                       "$ torchrun ddp_scripts/c.py\n")]
    nb.cells = [cell]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    scripts = launched_scripts(path)
    assert scripts == ["ddp_scripts/a.py", "ddp_scripts/b.py", "ddp_scripts/c.py"]
    (tmp_path / "ddp_scripts").mkdir()
    (tmp_path / "ddp_scripts" / "a.py").write_text("from ddp_common import setup\n"
                                                   "world = setup(ddp=True)\n")
    (tmp_path / "ddp_scripts" / "b.py").write_text("import torch.distributed as dist\n"
                                                   "dist.barrier()\n")
    (tmp_path / "ddp_scripts" / "c.py").write_text("from c_harness import run\nrun()\n")
    (tmp_path / "ddp_scripts" / "c_harness.py").write_text("model = DDP(model)\n")  # DDP inside
    assert [builds_ddp(s, tmp_path) for s in scripts] == [True, False, True]


def test_the_floor_counts_each_launchs_processes(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("launch(...)")
    cell.outputs = [nbformat.v4.new_output("stream", text=(
        "$ python ddp_scripts/a.py --out x.json\n"
        "$ torchrun --standalone --nproc-per-node=4 --tee 3 ddp_scripts/b.py\n"
        "nodeA$ torchrun --nnodes=2 --nproc-per-node=2 ddp_scripts/c.py &\n"
        "nodeB$ torchrun --nnodes=2 --nproc-per-node=2 ddp_scripts/c.py &\n"
        "[rank0]: done\n"
        "$ RANK=0 python ddp_scripts/d.py &\n$ RANK=1 python ddp_scripts/d.py &\n"))]
    nb.cells = [cell]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    found = launches(path)
    assert [(f.script, f.processes, f.torchrun) for f in found] == [
        ("ddp_scripts/a.py", 1, False), ("ddp_scripts/b.py", 4, True),
        ("ddp_scripts/c.py", 4, True), ("ddp_scripts/d.py", 2, False)]
    minimal = {1: 2.0, 2: 3.0, 4: 5.0}
    floors = [launch_floor(f, minimal, bare=1.0, ddp_extra=0.0) for f in found]
    assert floors[1] == floors[2] == 5.0  # the 4-process launch, measured
    assert floors[0] == 1.0  # one plain python start
