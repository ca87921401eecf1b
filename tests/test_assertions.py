"""A failed check in a lesson shows the values it compared (tools/assertions.py): run in a
real kernel, as a lesson runs, the check after `from tools.launch import launch` says
`assert 3 == 4`, not a bare AssertionError; a check with its own message keeps it."""
import ast

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tools import assertions
from tools.course import NOTEBOOKS


def run_cells(*sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def test_a_failed_check_in_a_lessons_kernel_shows_what_it_compared():
    with pytest.raises(CellExecutionError) as failed:
        run_cells("from tools.launch import launch",
                  "# a comment first, as lessons write them\nranks = [0, 1, 2]\n"
                  "assert len(ranks) == 4")
    assert "assert 3 == 4" in str(failed.value), str(failed.value)[-2000:]
    assert "where 3 = len([0, 1, 2])" in str(failed.value)
    with pytest.raises(CellExecutionError) as failed:
        run_cells("from tools.launch import launch",
                  "x = 3\nassert x == 4, f'expected 4 ranks, got {x}'")
    assert "expected 4 ranks, got 3" in str(failed.value)  # its own message first
    assert "assert 3 == 4" in str(failed.value)


def test_without_the_course_imported_a_kernel_is_unchanged():
    with pytest.raises(CellExecutionError) as failed:
        run_cells("x = 3\nassert x == 4")
    assert "assert 3 == 4" not in str(failed.value)


def test_a_rewritten_cell_compiles_as_ipython_compiles_it():
    """IPython fills missing locations, then compiles each statement: the imports the
    rewrite adds must not get a line range that ends before it starts."""
    source = "# a comment\n\nx = 3\nassert x == 3\nx"
    tree = ast.fix_missing_locations(assertions.RewriteAsserts().visit(ast.parse(source)))
    for node in tree.body:
        compile(ast.Module([node], []), "<cell>", "exec")


def test_the_rewrite_leaves_cells_without_asserts_alone():
    tree = ast.parse("y = 5\ny")
    assert assertions.RewriteAsserts().visit(tree) is tree
    assert ast.dump(tree) == ast.dump(ast.parse("y = 5\ny"))
    assert assertions.register(shell=None) is False  # no IPython here: nothing to add to
