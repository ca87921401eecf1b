"""tools/constant_checks.py: what it calls a check on constants, and what it lets through."""
import nbformat

from tools.constant_checks import constant_asserts


def found(*cells, tags=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    for cell, cell_tags in zip(nb.cells, tags or []):
        cell.metadata["tags"] = cell_tags
    return [line for _, line in constant_asserts(nb)]


def test_literals_parameters_and_pure_arithmetic_are_constants():
    assert found("world_size = 2", "n = world_size * 3\nassert n % 2 == 0",
                 tags=[["parameters"], []]) == ["assert n % 2 == 0"]
    assert found("assert all(245 % n for n in (2, 3, 4))") == [
        "assert all(245 % n for n in (2, 3, 4))"]
    assert found("def area(w, h):\n    return w * h\nassert area(2, 3) == 6") == [
        "assert area(2, 3) == 6"]
    assert found("import math\nassert math.sqrt(4) == 2") == ["assert math.sqrt(4) == 2"]
    assert found("x = 4\nassert math_sqrt(x) == 2") == []  # an unknown function may read a run


def test_an_and_with_a_constant_part_is_found():
    assert found("run = launch('x.py')\nassert run.data['n'] == 245 and 245 % 2") == [
        "assert run.data['n'] == 245 and 245 % 2"]


def test_what_a_run_made_is_not_constant():
    assert found("run = launch('x.py')\nassert run.data['n'] == 3") == []
    assert found("rows = []\nfor i in range(3):\n    rows.append(measure(i))\n"
                 "assert rows[0] > 0") == []
    assert found("ok = False\ntry:\n    h()\n    ok = True\nexcept ValueError:\n    pass\n"
                 "assert ok") == []
    assert found("if launch('x').ok:\n    n = 1\nelse:\n    n = 2\nassert n == 1") == []


def test_a_learners_function_is_what_the_check_reads():
    cells = ["def ring_steps(n):\n    return 2 * (n - 1)", "assert ring_steps(4) == 6"]
    assert found(*cells, tags=[["solution"], ["check"]]) == []
    assert found(*cells) == ["assert ring_steps(4) == 6"]


def test_arithmetic_on_purpose_says_so():
    assert found("assert 2 + 2 == 4  # arithmetic: the text's sum") == []
    assert found("world_size = 2", "assert world_size >= 2, 'needs 2'  # parameters",
                 tags=[["parameters"], []]) == []
