"""`make bench` counts a lesson's launches from the commands the launchers echo."""
import nbformat

from tools.bench import launches_in


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
