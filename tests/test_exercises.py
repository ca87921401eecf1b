"""The exercise mechanism itself, and `make student`."""
import nbformat
import pytest

from tools.course import lessons
from tools.exercises import (
    BEGIN,
    ExerciseFormatError,
    exercise_list,
    exercises,
    proof_version,
    stub_source,
    student_version,
)
from tools.student import write_student_course

SOLUTION = """\
# STUB: answer = None  # your answer
### BEGIN SOLUTION
answer = 6 * 7
### END SOLUTION
print(answer)"""


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def test_stub_replaces_the_solution_block():
    assert stub_source(SOLUTION) == "answer = None  # your answer\nprint(answer)"


def test_indented_solution_keeps_its_indentation():
    source = ("def f():\n    # STUB: return 0\n    ### BEGIN SOLUTION\n    return 1\n"
              "    ### END SOLUTION\n")
    assert stub_source(source) == "def f():\n    return 0"


def test_each_block_gets_the_stub_lines_before_it():
    source = ("def f():\n    # STUB: pass\n    ### BEGIN SOLUTION\n    write()\n"
              "    ### END SOLUTION\n\n\ndef g():\n    # STUB: return 0\n"
              "    ### BEGIN SOLUTION\n    return read()\n    ### END SOLUTION\n\n\nmain()\n")
    assert stub_source(source) == ("def f():\n    pass\n\n\ndef g():\n    return 0\n\n\n"
                                   "main()")


def test_student_and_proof_versions():
    nb = notebook((SOLUTION, ["solution"]), ("assert answer == 42", ["check"]))
    student = student_version(nb)
    assert "6 * 7" not in student.cells[0].source and BEGIN not in student.cells[0].source
    assert nb.cells[0].source == SOLUTION  # the original is untouched
    proof = proof_version(nb)
    assert [c.metadata["tags"] for c in proof.cells] == [
        ["solution"], ["check"], ["exercise-proof"], ["exercise-proof"]]
    assert proof.cells[2].source == student.cells[0].source


def test_the_proof_cell_fails_when_a_check_accepts_the_stub():
    nb = notebook((SOLUTION, ["solution"]), ("assert True", ["check"]))
    namespace = {}
    exec(proof_version(nb).cells[2].source, namespace)  # the stub
    with pytest.raises(AssertionError, match="its check passed on the stub"):
        exec(proof_version(nb).cells[3].source, namespace)


@pytest.mark.parametrize("cells, problem", [
    ([("answer = 1", ["solution"]), ("assert answer", ["check"])], "no ### BEGIN"),
    ([(SOLUTION, ["solution"])], "not followed by a cell tagged 'check'"),
    ([(SOLUTION.replace("# STUB: ", "# "), ["solution"]), ("assert 1", ["check"])], "STUB"),
])
def test_malformed_exercises_are_refused(cells, problem):
    with pytest.raises(ExerciseFormatError, match=problem):
        exercises(notebook(*cells))


def test_make_student_writes_a_course_without_solutions(tmp_path):
    written = write_student_course(tmp_path / "student")
    assert [p.name for p in written] == [p.name for p in lessons()]
    for original, path in zip(lessons(), written):
        teacher = nbformat.read(original, as_version=4)
        student = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in student.cells)
        assert BEGIN not in text and "END SOLUTION" not in text and "# STUB:" not in text
        pairs = exercises(teacher)
        assert len(pairs) >= 2, f"{original.name} needs at least two exercises"
        by_id = {cell.id: cell for cell in student.cells}
        for i, _ in pairs:  # (the student's version has no hidden cells: match by id)
            assert by_id[teacher.cells[i].id].source == stub_source(teacher.cells[i].source)
    for part in ("ddp_scripts", "tools", "images", "README.md", "requirements.txt"):
        assert (tmp_path / "student" / part).exists()
    assert not (tmp_path / "student" / "tests").exists()


def test_hidden_checks_and_near_misses_are_for_grading_only():
    nb = notebook((SOLUTION, ["solution"]), ("assert answer == 42", ["check"]),
                  ("assert answer % 2 == 0, 'even'", ["hidden"]),
                  ("Near miss: 42 by another road.\n- answer = 6 * 7\n+ answer = 40 + 2",
                   ["near-miss"]))
    nb.cells[3] = nbformat.v4.new_raw_cell(nb.cells[3].source, metadata=nb.cells[3].metadata)
    assert [c.metadata["tags"] for c in student_version(nb).cells] == [["solution"], ["check"]]
    proof = proof_version(nb)
    sources = [c.source for c in proof.cells]
    assert sources[0] == SOLUTION and sources[1] == "assert answer == 42"
    assert "def visible_check(**names)" in sources[2]
    assert sources[3].startswith("assert answer % 2 == 0")  # the hidden check, to pass
    assert "answer = 40 + 2" in sources[4]  # the near miss
    assert sources[5].startswith("assert answer == 42")  # the visible check, to pass
    assert "a hidden check must reject it" in sources[6]
    assert sources[7] == stub_source(SOLUTION)  # then the stub, which must fail
    assert "the check must reject the stub" in sources[8] and len(sources) == 9
    # a near miss that passes every hidden check fails the proof
    namespace = {}
    for source in (sources[4], sources[6]):
        if source is sources[6]:
            with pytest.raises(AssertionError, match="near miss 1 passed every hidden check"):
                exec(source, namespace)
        else:
            exec(source, namespace)


@pytest.mark.parametrize("extra, problem", [
    ([("- answer = 6 * 7\n+ answer = 41", ["near-miss"])], "near misses without a hidden"),
    ([("assert answer, 'x'", ["hidden"]), ("- answer = 5\n+ answer = 4", ["near-miss"])],
     "occur 0 times"),
])
def test_malformed_grading_cells_are_refused(extra, problem):
    nb = notebook((SOLUTION, ["solution"]), ("assert answer == 42", ["check"]), *extra)
    for i, cell in enumerate(nb.cells):
        if "near-miss" in cell.metadata["tags"]:
            nb.cells[i] = nbformat.v4.new_raw_cell(cell.source, metadata=cell.metadata)
    with pytest.raises(ExerciseFormatError, match=problem):
        exercise_list(nb)
