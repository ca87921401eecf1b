"""`make grade`: the grader on small made-up notebooks (every way an exercise can end,
exact lines and scores; timeouts; the processes a lesson leaves behind), and on a real
lesson: its student version graded inside a handout written by `make student`, and its
instructor version."""
import os
import re
import subprocess
import sys
import time

import nbformat
import pytest

from tools.course import REPO, make_workspace
from tools.exercises import exercise_cells, exercises, student_version
from tools.grade import main
from tools.grade_kernel import describe
from tools.student import write_student_course

LOOP_TIMEOUT_S = 8  # the exercise timeout in these tests: the endless loop stops here


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def grade(capsys, *argv):
    """Run the grader's command line; its exit status and printed lines (seconds blanked)."""
    status = main([str(a) for a in argv])
    lines = re.sub(r"\(\d+\.\d s\)", "(T s)", capsys.readouterr().out).splitlines()
    return status, [line for line in lines if not line.startswith("# ")]


def alive(pid: int) -> bool:
    state = subprocess.run(["ps", "-p", str(pid), "-o", "stat="], capture_output=True,
                           text=True).stdout.strip()
    return state != "" and not state.startswith("Z")


HANGING_WORKER = """import os, pathlib, sys, time
pathlib.Path(sys.argv[1], str(os.getpid())).write_text("")
while True:
    time.sleep(0.1)
"""


def learner_notebook(pid_dir):
    return notebook(
        ("world_size = 2", ["parameters"]),
        ("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path.cwd().parent))\n"
         "from tools.launch import launch", []),
        # torchrun started by a cell, as tools.launch does (a session of its own), running
        # two workers that never end; the cell waits until both have started
        (f"%%writefile ../ddp_scripts/zz_grade_worker.py\n{HANGING_WORKER}", []),
        ("import subprocess, time\n"
         "agent = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', "
         "'--standalone', '--nproc-per-node=2', 'ddp_scripts/zz_grade_worker.py', "
         f"{str(pid_dir)!r}], cwd='..', start_new_session=True)\n"
         f"Path({str(pid_dir)!r}, 'agent').write_text(str(agent.pid))\n"
         "deadline = time.monotonic() + 120\n"
         f"while len(list(Path({str(pid_dir)!r}).glob('[0-9]*'))) < 2:\n"
         "    assert time.monotonic() < deadline and agent.poll() is None\n"
         "    time.sleep(0.1)", []),
        # 1: right
        ("def f():\n    return 42", ["solution"]), ("assert f() == 42", ["check"]),
        # 2: wrong, the assert has a message
        ("def g():\n    return 0", ["solution"]), ("assert g() == 1, 'g must return 1'", ["check"]),
        # 3: a stub that loops forever; stopped, it takes the torchrun above with it
        ("def h():\n    while True:\n        pass", ["solution"]),
        ("assert h() == 3", ["check"]),
        # 4: the learner's code raises
        ("answer = undefined_name + 1", ["solution"]), ("assert answer == 2", ["check"]),
        # 5: a bare assert over two lines, inside a loop
        ("def k(x):\n    return x", ["solution"]),
        ("for x in (3, 2):\n    assert k(x) \\\n        == 3  # a comment", ["check"]),
        # 6: code that does not compile
        ("def broken(:\n    pass", ["solution"]), ("assert broken() is None", ["check"]),
        # 7: a script exercise whose script is right
        ("%%writefile ../ddp_scripts/zz_grade_ok.py\nprint('hello')", ["solution"]),
        ("assert launch('ddp_scripts/zz_grade_ok.py', nproc=None, timeout=30).output"
         " == 'hello\\n'", ["check"]),
        # 8: a script exercise whose script hangs: the launch's own timeout fails it
        ("%%writefile ../ddp_scripts/zz_grade_hang.py\nimport time\nwhile True:\n"
         "    time.sleep(0.1)", ["solution"]),
        ("launch('ddp_scripts/zz_grade_hang.py', nproc=None, timeout=2)", ["check"]),
        # the learner broke a cell that is no exercise: the lesson stops there
        ("ratio = 1 / 0", []),
        # 9: never reached
        ("def m():\n    return 1", ["solution"]), ("assert m() == 1", ["check"]),
    )


def test_every_way_an_exercise_ends(tmp_path, capsys):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    path = tmp_path / "01_demo.ipynb"
    nbformat.write(learner_notebook(pid_dir), path)
    status, lines = grade(capsys, path, "--timeout", LOOP_TIMEOUT_S, "--build", tmp_path / "b",
                          "--require-all")
    assert lines == [
        "01_demo  exercise 1  passed",
        "01_demo  exercise 2  failed: AssertionError: g must return 1",
        f"01_demo  exercise 3  failed: timed out: still running after {LOOP_TIMEOUT_S} s, "
        "stopped",
        "01_demo  exercise 4  failed: NameError: name 'undefined_name' is not defined "
        "(in the solution cell)",
        "01_demo  exercise 5  failed: AssertionError: assert k(x) == 3",
        "01_demo  exercise 6  failed: SyntaxError: invalid syntax (line 1) "
        "(in the solution cell)",
        "01_demo  exercise 7  passed",
        "01_demo  exercise 8  failed: LaunchTimeout: `python ddp_scripts/zz_grade_hang.py` "
        "did not finish within 2 s and was killed (its whole process tree).",
        "01_demo  STOPPED: cell 21 failed (ZeroDivisionError: division by zero); "
        "it starts: ratio = 1 / 0",
        "01_demo  exercise 9  not run (the lesson stopped before it)",
        "01_demo  score 2/9  (T s)",
        "total  2/9",
    ]
    assert status == 1  # --require-all: not everything passed

    # The endless loop was stopped at the exercise timeout, not at papermill's backstop.
    results = [eval(line.replace("true", "True"))  # one JSON object per line
               for line in (tmp_path / "b" / "executed" / "01_demo.results.jsonl")
               .read_text().splitlines()]
    loop = next(r for r in results if r["exercise"] == 3)
    assert LOOP_TIMEOUT_S - 0.5 <= loop["seconds"] < LOOP_TIMEOUT_S + 5, loop
    # and the torchrun that an earlier cell had started was killed with it, workers and all
    agent = int((pid_dir / "agent").read_text())
    workers = [int(p.name) for p in pid_dir.glob("[0-9]*")]
    assert len(workers) == 2
    assert [pid for pid in [agent, *workers] if alive(pid)] == []


def test_timeouts_stop_only_their_lesson(tmp_path, capsys, monkeypatch):
    """A lesson past --lesson-timeout stops at the cell then running; a cell that even the
    kernel's timer cannot stop (SIGALRM blocked) stops at papermill's backstop, its kernel
    killed, and the process it left (in a session of its own) is killed by the grader."""
    monkeypatch.setattr("tools.course.CELL_TIMEOUT_S", 15)
    orphan = tmp_path / "orphan.pid"
    nbformat.write(notebook(("def f():\n    return 1", ["solution"]),
                            ("assert f() == 1", ["check"]),
                            ("import time\ntime.sleep(600)", []),
                            ("def g():\n    return 1", ["solution"]),
                            ("assert g() == 1", ["check"])),
                   tmp_path / "01_slow.ipynb")
    nbformat.write(notebook(("import signal, subprocess, time\n"
                             "child = subprocess.Popen(['sleep', '600'], "
                             "start_new_session=True)\n"
                             f"open({str(orphan)!r}, 'w').write(str(child.pid))\n"
                             "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
                             "time.sleep(600)", []),
                            ("x = 1", ["solution"]), ("assert x == 1", ["check"])),
                   tmp_path / "02_stuck.ipynb")
    nbformat.write(notebook(("x = 1", ["solution"]), ("assert x == 1", ["check"])),
                   tmp_path / "03_next.ipynb")
    start = time.monotonic()
    status, lines = grade(capsys, tmp_path, "--timeout", 5, "--lesson-timeout", 10,
                          "--build", tmp_path / "b")
    assert time.monotonic() - start < 150
    assert lines == [
        "01_slow  exercise 1  passed",
        "01_slow  STOPPED: cell 3 failed (LessonTimeout: the lesson ran past its 10 s "
        "(--lesson-timeout), stopped); it starts: import time",
        "01_slow  exercise 2  not run (the lesson stopped before it)",
        "01_slow  score 1/2  (T s)",
        "02_stuck  STOPPED: cell 1 failed (CellTimeoutError: A cell timed out while it was "
        "being executed, after 15 seconds.); it starts: import signal, subprocess, time",
        "02_stuck  exercise 1  not run (the lesson stopped before it)",
        "02_stuck  score 0/1  (T s)",
        "03_next  exercise 1  passed",  # the next lesson is graded as usual
        "03_next  score 1/1  (T s)",
        "total  2/4",
    ]
    assert status == 0  # grading completed, whatever the score
    assert not alive(int(orphan.read_text()))


def test_the_grader_says_when_it_cannot_run(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # a folder without lessons
    assert "no lessons (NN_name.ipynb) in" in capsys.readouterr().err
    assert main([str(tmp_path / "01_missing.ipynb")]) == 2
    assert capsys.readouterr().err == f"grade: {tmp_path / '01_missing.ipynb'}: no such file " \
                                      "or folder\n"
    (tmp_path / "answers.py").write_text("x = 1\n")
    assert main([str(tmp_path / "answers.py")]) == 2
    assert "answers.py: not a notebook (.ipynb) or a folder of lessons" \
        in capsys.readouterr().err
    (tmp_path / "01_broken.ipynb").write_text("{ not json")
    assert main([str(tmp_path / "01_broken.ipynb"), "--build", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.startswith(
        f"grade: could not grade {tmp_path / '01_broken.ipynb'}: ")


def test_first_lines_of_errors():
    try:
        exec(compile("x = 1\nassert x == \\\n    2  # why", "<check>", "exec"), {})
    except AssertionError as error:
        assert describe(error, "<check>", "x = 1\nassert x == \\\n    2  # why") \
            == "AssertionError: assert x == 2"
    assert describe(ValueError("first\nsecond"), "<check>", "") == "ValueError: first"
    assert describe(KeyError(), "<check>", "") == "KeyError"


def test_exercises_are_found_by_their_tags(tmp_path):
    teacher = nbformat.read(REPO / "notebooks" / "01_devices.ipynb", as_version=4)
    student = student_version(teacher)
    assert exercise_cells(student) == exercises(teacher)
    # a cell the learner added between a solution and its check changes nothing
    student.cells.insert(exercises(teacher)[0][0] + 1, nbformat.v4.new_code_cell("1 + 1"))
    pairs = exercise_cells(student)
    assert len(pairs) == len(exercises(teacher)) and pairs[0][1] == pairs[0][0] + 2


def test_the_handout_holds_no_solution_and_grades_its_own_notebooks(tmp_path):
    handout = tmp_path / "student"
    write_student_course(handout)
    for path in handout.rglob("*"):  # nor in a script that a solution cell writes
        if path.suffix in (".py", ".ipynb") and path.parent.name != "tools":
            assert "### BEGIN SOLUTION" not in path.read_text(), path
    assert "\ngrade:" in (handout / "Makefile").read_text()
    assert "\nlab:" in (handout / "Makefile").read_text()
    found = subprocess.run(
        [sys.executable, "-c", "from tools.grade import default_notebooks as d; print(d())"],
        cwd=handout, capture_output=True, text=True, check=True).stdout.strip()
    assert found == str(handout / "notebooks")


LESSON = "01_devices"  # among the quickest lessons


@pytest.fixture(scope="module")
def handout_graded(tmp_path_factory):
    """`make student`, then `make grade`'s command run inside the handout on its lesson:
    the handout's own layout (../ddp_scripts, ../tools) is what the lesson runs in."""
    tmp = tmp_path_factory.mktemp("grade")
    handout = tmp / "student"
    write_student_course(handout)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "tools.grade", f"notebooks/{LESSON}.ipynb",
                           "--build", str(tmp / "b")], cwd=handout, env=env,
                          capture_output=True, text=True, timeout=900)
    return done


@pytest.fixture(scope="module")
def count():
    return len(exercises(nbformat.read(REPO / "notebooks" / f"{LESSON}.ipynb", as_version=4)))


def test_a_real_lesson_stubs_fail_every_check(handout_graded, count):
    assert handout_graded.returncode == 0, handout_graded.stderr
    lines = handout_graded.stdout.splitlines()
    assert lines[0].startswith("# ") and lines[0].endswith(f"notebooks/{LESSON}.ipynb")
    exercise_lines = lines[1:1 + count]
    for number, line in enumerate(exercise_lines, start=1):
        assert line.startswith(f"{LESSON}  exercise {number}  failed: AssertionError: "), \
            handout_graded.stdout
    assert re.fullmatch(rf"{LESSON}  score 0/{count}  \(\d+\.\d s\)", lines[1 + count])
    assert lines[2 + count:] == [f"total  0/{count}"]


def test_a_real_lesson_solutions_pass_every_check(tmp_path, count):
    from tools.grade import grade_notebook
    graded = grade_notebook(REPO / "notebooks" / f"{LESSON}.ipynb",
                            make_workspace(tmp_path / "course"), tmp_path / "executed",
                            world_size=2, timeout=150)
    assert not graded.stopped
    assert [o.status for o in graded.outcomes] == ["passed"] * count
