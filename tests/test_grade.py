"""`make grade`: the grader on small made-up lessons (every way an exercise can end, exact
lines and points; timeouts; the processes a lesson leaves behind; which cells it runs),
then a class of four simulated students on two real lessons, graded end to end: the right
answers, the handout untouched, near misses, and a tampered hand-in."""
import csv
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import nbformat
import pytest

from tools.course import REPO, share_warm_server
from tools.exercises import exercise_list, near_miss_source, student_version
from tools.grade import confining, main, match_solutions, plan_lesson
from tools.grade_cells import launches, names, needed_cells
from tools.grade_kernel import describe
from tools.student import write_student_course

LOOP_TIMEOUT_S = 8  # the exercise timeout in these tests: the endless loop stops here


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for k, (source, tags) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        cell.id = f"c{k}"
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def answer(name, body, stub="pass"):
    """An instructor's solution cell defining `name`."""
    return (f"def {name}():\n    # STUB: {stub}\n    ### BEGIN SOLUTION\n    {body}\n"
            f"    ### END SOLUTION", ["solution"])


def grade(capsys, *argv):
    """Run the grader's command line; its exit status and printed lines (seconds blanked)."""
    status = main([str(a) for a in argv])
    out = capsys.readouterr().out
    lines = re.sub(r"\(\d+\.\d s\)", "(T s)", out).splitlines()
    return status, [line for line in lines if line and not line.startswith("# ")]


def running_with(text: str) -> list[int]:
    """The live processes whose command line holds `text`: found by what they run, since a
    pid written inside a student's PID namespace means another process out here."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in command and state != "Z" and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


HANGING_WORKER = """import os, pathlib, sys, time
pathlib.Path(sys.argv[1], str(os.getpid())).write_text("")
while True:
    time.sleep(0.1)
"""


def lesson_pair(pid_dir):
    """(the instructor's lesson, a learner's hand-in) for every way an exercise ends."""
    teacher = notebook(
        ("world_size = 2", ["parameters"]),
        ("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path.cwd().parent))\n"
         "from tools.launch import launch", []),
        # torchrun started by a cell, as tools.launch does (a session of its own), running
        # two workers that never end; the cell waits until both have started. Grading runs
        # it though no exercise needs it (grade-setup).
        (f"%%writefile ../ddp_scripts/zz_grade_worker.py\n{HANGING_WORKER}", []),
        ("import subprocess, time\n"
         "agent = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', "
         "'--standalone', '--nproc-per-node=2', 'ddp_scripts/zz_grade_worker.py', "
         f"{str(pid_dir)!r}], cwd='..', start_new_session=True)\n"
         f"Path({str(pid_dir)!r}, 'agent').write_text(str(agent.pid))\n"
         "deadline = time.monotonic() + 120\n"
         f"while len(list(Path({str(pid_dir)!r}).glob('[0-9]*'))) < 2:\n"
         "    assert time.monotonic() < deadline and agent.poll() is None\n"
         "    time.sleep(0.1)", ["grade-setup"]),
        ("experiment = 1 / 0  # a lesson cell no exercise needs: never run", []),
        answer("f", "return 42"), ("assert f() == 42, 'f must return 42'", ["check"]),
        answer("g", "return 1"), ("assert g() == 1, 'g must return 1'", ["check"]),
        answer("h", "return 3"), ("assert h() == 3", ["check"]),
        ("# STUB: answer = None\n### BEGIN SOLUTION\nanswer = 2\n### END SOLUTION",
         ["solution"]), ("assert answer == 2", ["check"]),
        ("def k(x):\n    # STUB: pass\n    ### BEGIN SOLUTION\n    return 3\n"
         "    ### END SOLUTION", ["solution"]),
        ("for x in (3, 2):\n    assert k(x) \\\n        == 3  # a comment", ["check"]),
        answer("broken", "return None"), ("assert broken() is None", ["check"]),
        ("%%writefile ../ddp_scripts/zz_grade_ok.py\n# STUB: pass\n### BEGIN SOLUTION\n"
         "print('hello')\n### END SOLUTION", ["solution"]),
        ("assert launch('ddp_scripts/zz_grade_ok.py', nproc=None, timeout=30).output"
         " == 'hello\\n', 'expected the script to print hello'", ["check"]),
        ("%%writefile ../ddp_scripts/zz_grade_hang.py\n# STUB: pass\n### BEGIN SOLUTION\n"
         "print('done')\n### END SOLUTION", ["solution"]),
        ("launch('ddp_scripts/zz_grade_hang.py', nproc=None, timeout=2)", ["check"]),
        answer("m", "return 1"), ("assert m() == 1, 'm must return 1'", ["check"]),
        answer("p", "return [1, 2]"),
        ("assert p() == [1, 2], 'p must return [1, 2]'", ["check"]),
        ("assert p()[0] == 1, 'p()[0] must be 1'", ["hidden"]),
        ("Near miss: [1, 2] as a tuple.\n- return [1, 2]\n+ return (1, 2)", ["near-miss"]),
    )
    teacher.cells[-3].metadata["points"] = 2
    teacher.cells[-1].cell_type = "raw"
    teacher.cells[-1].pop("outputs"), teacher.cells[-1].pop("execution_count")
    learner = student_version(teacher)
    answers = {
        "f": "def f():\n    return 42",  # 1: right
        "g": "def g():\n    return 0",  # 2: wrong, the assert has a message
        "h": "def h():\n    while True:\n        pass",  # 3: loops forever, with the torchrun
        "answer": "answer = undefined_name + 1",  # 4: the learner's code raises
        "k": "def k(x):\n    return x",  # 5: a bare assert over two lines, in a loop
        "broken": "def broken(:\n    pass",  # 6: does not compile
        "zz_grade_ok": "%%writefile ../ddp_scripts/zz_grade_ok.py\nprint('hello')",  # 7
        "zz_grade_hang": "%%writefile ../ddp_scripts/zz_grade_hang.py\nimport time\n"
                         "while True:\n    time.sleep(0.1)",  # 8: the launch's timeout
        "m": "def m():\n    return 1 / 0",  # 9: raises inside the check: the learner's line
        "p": "def p():\n    return [2, 1]",  # 10: wrong in both parts
    }
    solutions = [c for c in learner.cells if "solution" in c.metadata["tags"]]
    for cell, source in zip(solutions, answers.values()):
        cell.source = source
    # a scratch cell that raises, before exercise 9: it costs nothing (it never runs)
    scratch = nbformat.v4.new_code_cell("import math\nmath.sqrt(-1)  # trying things")
    scratch.id = "scratch"
    learner.cells.insert(learner.cells.index(solutions[8]), scratch)
    # a helper of the learner's own, which exercise 1's answer uses: it runs
    helper = nbformat.v4.new_code_cell("def forty_two():\n    return 6 * 7")
    helper.id = "helper"
    learner.cells.insert(learner.cells.index(solutions[0]), helper)
    solutions[0].source = "def f():\n    return forty_two()"
    return teacher, learner


def test_every_way_an_exercise_ends(tmp_path, capsys):
    # in the student's executed notebooks' folder: one that a student's code may write to
    # (in a view of its own, root on Linux, nothing else is), and that stays after grading
    pid_dir = tmp_path / "out" / "executed" / "ann" / "pids"
    pid_dir.mkdir(parents=True)
    teacher, learner = lesson_pair(pid_dir)
    (tmp_path / "teacher").mkdir()
    nbformat.write(teacher, tmp_path / "teacher" / "01_demo.ipynb")
    (tmp_path / "class" / "ann").mkdir(parents=True)
    nbformat.write(learner, tmp_path / "class" / "ann" / "01_demo.ipynb")
    status, lines = grade(capsys, tmp_path / "class", "--teacher", tmp_path / "teacher",
                          "--timeout", LOOP_TIMEOUT_S, "--out", tmp_path / "out",
                          "--require-all")
    ex = "ann  01_demo  exercise"
    assert lines[:12] == [
        f"{ex} 1 (f) check  passed  1/1",
        f"{ex} 2 (g) check  failed  0/1: AssertionError: g must return 1",
        f"{ex} 3 (h) check  failed  0/1: timed out: still running after {LOOP_TIMEOUT_S} s, "
        "stopped [raised in your code: solution cell, line 2, in h, called by the check's "
        "`assert h() == 3`]",
        f"{ex} 4 (answer) check  failed  0/1: not checked: the solution cell failed (NameError: "
        "name 'undefined_name' is not defined)",
        f"{ex} 5 (k) check  failed  0/1: AssertionError: assert 2 == 3",
        f"{ex} 6 (broken) check  failed  0/1: not checked: the solution cell failed "
        "(SyntaxError: invalid syntax (line 1))",
        f"{ex} 7 (zz_grade_ok.py) check  passed  1/1",
        f"{ex} 8 (zz_grade_hang.py) check  failed  0/1: LaunchTimeout: `python "
        "ddp_scripts/zz_grade_hang.py` did not finish within 2 s and was killed (its whole "
        "process tree).",
        f"{ex} 9 (m) check  failed  0/1: ZeroDivisionError: division by zero [raised in "
        "your code: solution cell, line 2, in m, called by the check's `assert m() == 1, "
        "'m must return 1'`]",
        f"{ex} 10 (p) check  failed  0/2: AssertionError: p must return [1, 2]",
        f"{ex} 10 (p) hidden 1  failed  0/1: not run: the visible check failed",
        "ann  01_demo  score 2/12  (T s)",
    ]
    assert status == 1  # --require-all: not everything passed

    # The endless loop was stopped at the exercise timeout, and the torchrun that an
    # earlier cell had started was killed with it, workers and all.
    rows = list(csv.DictReader((tmp_path / "out" / "gradebook.csv").open()))
    loop = next(r for r in rows if r["exercise"] == "3")
    assert LOOP_TIMEOUT_S - 0.5 <= float(loop["seconds"]) < LOOP_TIMEOUT_S + 5, loop
    assert (pid_dir / "agent").exists() and len(list(pid_dir.glob("[0-9]*"))) == 2
    assert running_with(str(pid_dir)) == []  # the agent and its workers
    # pytest's rewriting shows the values of a bare assert on the feedback page
    page = (tmp_path / "out" / "feedback" / "ann.html").read_text()
    assert "where" in page and "Feedback for ann" in page


def test_timeouts_stop_only_their_lesson(tmp_path, capsys, monkeypatch):
    """Every cell runs within --timeout; a lesson past --lesson-timeout stops at the cell
    then running, and its exercises after it are not run; a cell that even the
    kernel's timer cannot stop (SIGALRM ignored) stops at papermill's backstop, its kernel
    killed, and the process it left (in a session of its own) is killed by the grader."""
    monkeypatch.setattr("tools.course.CELL_TIMEOUT_S", 15)
    orphan = tmp_path / "out" / "executed" / "bo" / "orphan.pid"  # (written by the student)
    orphan.parent.mkdir(parents=True)
    lessons = {
        # three cells of 4 s, each within --timeout (5 s), together past --lesson-timeout
        "01_slow": notebook(answer("f", "return 1"), ("assert f() == 1, 'f'", ["check"]),
                            *[("import time\ntime.sleep(4)", ["grade-setup"])] * 3,
                            answer("g", "return 1"), ("assert g() == 1, 'g'", ["check"])),
        "02_stuck": notebook(("import signal, subprocess, time\n"
                              "child = subprocess.Popen(['sleep', '601.5'], "
                              "start_new_session=True)\n"
                              f"open({str(orphan)!r}, 'w').write(str(child.pid))\n"
                              "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                              "time.sleep(600)", ["grade-setup"]),
                             answer("x", "return 1"), ("assert x() == 1, 'x'", ["check"])),
        "03_next": notebook(answer("y", "return 1"), ("assert y() == 1, 'y'", ["check"])),
    }
    for folder in ("teacher", "bo"):
        (tmp_path / folder).mkdir()
        for stem, nb in lessons.items():
            nbformat.write(nb, tmp_path / folder / f"{stem}.ipynb")
    status, lines = grade(capsys, tmp_path / "bo", "--teacher", tmp_path / "teacher",
                          "--timeout", 5, "--lesson-timeout", 10, "--out", tmp_path / "out")
    assert lines[:9] == [
        "bo  01_slow  STOPPED: LessonTimeout: the lesson ran past its 10 s (--lesson-timeout)"
        ", stopped (in lesson cell 5: import time)",
        "bo  01_slow  exercise 1 (f) check  passed  1/1",
        "bo  01_slow  exercise 2 (g) check  not run  0/1: the lesson stopped before it",
        "bo  01_slow  score 1/2  (T s)",
        "bo  02_stuck  STOPPED: CellTimeoutError: A cell timed out while it was being "
        "executed, after 15 seconds. (in lesson cell 1: import signal, subprocess, time)",
        "bo  02_stuck  exercise 1 (x) check  not run  0/1: the lesson stopped before it",
        "bo  02_stuck  score 0/1  (T s)",
        "bo  03_next  exercise 1 (y) check  passed  1/1",  # the next lesson as usual
        "bo  03_next  score 1/1  (T s)",
    ]
    assert status == 0  # grading completed, whatever the score
    assert orphan.exists() and running_with("sleep 601.5") == []


def test_the_grader_says_when_it_cannot_run(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # a folder without notebooks or student folders
    assert "no notebooks and no student folders in it" in capsys.readouterr().err
    assert main([str(tmp_path / "01_missing.ipynb")]) == 2
    assert capsys.readouterr().err == f"grade: {tmp_path / '01_missing.ipynb'}: no such file " \
                                      "or folder\n"
    (tmp_path / "answers.py").write_text("x = 1\n")
    assert main([str(tmp_path / "answers.py")]) == 2
    assert "answers.py: not a notebook (.ipynb) or a folder" in capsys.readouterr().err
    assert main([str(tmp_path), "--lessons", "99_nothing"]) == 2
    assert "no lesson with exercises named 99_nothing" in capsys.readouterr().err
    assert main([str(tmp_path), "--shard", "3/2"]) == 2


def test_first_lines_of_errors():
    try:
        exec(compile("x = 1\nassert x == \\\n    2  # why", "<check>", "exec"), {})
    except AssertionError as error:
        assert describe(error, "<check>", "x = 1\nassert x == \\\n    2  # why") \
            == "AssertionError: assert x == 2"
    assert describe(ValueError("first\nsecond"), "<check>", "") == "ValueError: first"
    assert describe(KeyError(), "<check>", "") == "KeyError"


def test_only_what_the_exercises_need_runs():
    """The cells a graded lesson runs: what the answers and checks read, the cells that
    change it without launching (`cluster.up()`), setup cells; not the lesson's
    experiments, nor a loop variable's earlier namesake."""
    assert names("import os\nos.environ['A'] = '1'\nfor n in range(3):\n    y = n") \
        == ({"os", "n", "y"}, {"os"}, {"sys"})
    assert names("def f(a):\n    return a + b + len([c for c in a])") \
        == ({"f"}, set(), {"b"})
    assert names("%%writefile x.py\nprint(1)") == (set(), set(), set())
    sources = [
        "import sys\nsys.path.insert(0, '..')",  # 0: setup
        "from tools import cluster",  # 1
        "seconds = cluster.up()",  # 2: assigns seconds, not cluster: not needed
        "cluster.start()",  # 3: changes cluster, launches nothing: needed
        "run = launch('x.py')\nname = 'experiment'",  # 4: an experiment: not needed
        "cluster.launch_on(srun('y'))",  # 5: changes cluster by launching: not needed
        "plot(run)",  # 6: needs the experiment: not needed
        "for name in ('a', 'b'):\n    print(name)",  # 7: its own name: not cell 4's
        "def answer():\n    return cluster.value",  # 8: an answer
        "assert answer() == 1, 'answer'",  # 9: its check
    ]
    assert needed_cells(sources, {7, 8, 9}) == {0, 1, 3, 7, 8, 9}


def test_a_lesson_on_hosts_is_judged_with_the_kernels_measurements():
    """Lesson 34: its checks run in the judge, which does not run the experiments on the
    hosts again (they are the kernel's): the kernel measures, and the judge binds the
    values its checks read from there, at the first exercise that reads each."""
    teacher = nbformat.read(REPO / "notebooks" / "34_slow_link.ipynb", as_version=4)
    plan = plan_lesson(teacher, teacher, "", "34_slow_link", judge=True)
    assert plan.judged_exercises == {1, 2}
    assert [kind for kind, source in plan.judged if kind == "lesson" and launches(source)] == []
    binds = [source for kind, source in plan.judged if kind == "bind"]
    assert "'measured'" in binds[0] and "'compute'" in binds[0] and "'grad_bytes'" in binds[0]
    assert "'on_wire'" in binds[1] and "'grad_bytes'" not in binds[1]
    kernel = "\n".join(cell.source for cell in plan.notebook.cells)
    assert "slow = run_both_hosts()" in kernel and "on_wire = " in kernel  # it measures
    assert "__grader__.part(" not in kernel and kernel.count("__grader__.serve(") == 2


def test_answers_are_matched_by_cell_id_then_in_order():
    teacher = notebook(answer("f", "return 1"), ("assert f() == 1, 'f'", ["check"]),
                       answer("g", "return 2"), ("assert g() == 2, 'g'", ["check"]))
    learner = student_version(teacher)
    exercises = exercise_list(teacher)
    assert {n: c.id for n, c in match_solutions(teacher, learner, exercises).items()} \
        == {1: "c0", 2: "c2"}
    learner.cells[0].id = "pasted"  # a cell copied and pasted gets a new id
    assert match_solutions(teacher, learner, exercises)[1].id == "pasted"
    del learner.cells[2:4]  # exercise 2 deleted
    assert set(match_solutions(teacher, learner, exercises)) == {1}


def test_honest_mistakes_in_a_notebook_are_matched_by_content_and_named():
    teacher = notebook(answer("f", "return 1"), ("assert f() == 1, 'f'", ["check"]),
                       answer("g", "return 2"), ("assert g() == 2, 'g'", ["check"]))
    exercises = exercise_list(teacher)
    # the answer written in a copy of the cell (a new id), the original left as handed out
    learner = student_version(teacher)
    copy = nbformat.v4.new_code_cell("def f():\n    return 1")
    copy.id = "copy"
    learner.cells.insert(1, copy)
    notes = []
    assert match_solutions(teacher, learner, exercises, notes)[1].id == "copy"
    assert notes == ["exercise 1: graded your cell 2, which defines its answer; the "
                     "exercise's own cell still holds the starting code"]
    # every id changed, a scratch cell first: the cells that define f and g are graded
    learner = student_version(teacher)
    for k, cell in enumerate(learner.cells):
        cell.id = f"new{k}"
    scratch = nbformat.v4.new_code_cell("x = 1  # scratch")
    scratch.id, scratch.metadata["tags"] = "scratch", ["solution"]
    learner.cells.insert(0, scratch)
    learner.cells[3].source = "def g():\n    return 2"
    notes = []
    found = match_solutions(teacher, learner, exercises, notes)
    assert (found[1].id, found[2].id) == ("new0", "new2"), notes
    assert len(notes) == 2 and all("was not found by its id" in n for n in notes)
    # tags removed or added: graded all the same, and said
    learner = student_version(teacher)
    learner.cells[0].metadata["tags"] = []
    learner.cells[1].metadata["tags"] = []
    mine = nbformat.v4.new_code_cell("y = 2")
    mine.id, mine.metadata["tags"] = "mine", ["check"]
    learner.cells.append(mine)
    plan = plan_lesson(teacher, learner, "")
    assert "exercise 1: its answer cell lost its `solution` tag (graded as the answer all " \
           "the same)" in plan.notes
    assert "exercise 1: its check cell lost its `check` tag; the instructor's check ran" \
        in plan.notes
    assert "tags on your own cells change nothing (`check`): the instructor's checks ran" \
        in plan.notes


def test_a_near_miss_is_a_change_to_the_solution():
    solution = "def f(n):\n    # STUB: pass\n    return n / world\n"
    assert near_miss_source(solution, "Near miss: 2.\n- return n / world\n+ return n / 2") \
        == "def f(n):\n    # STUB: pass\n    return n / 2\n"


def test_the_handout_is_a_repository_for_students(tmp_path):
    handout = tmp_path / "student"
    write_student_course(handout)
    for path in handout.rglob("*"):  # no solution, in a notebook or a script it writes
        if path.suffix in (".py", ".ipynb") and path.parent.name != "tools":
            assert "### BEGIN SOLUTION" not in path.read_text(), path
        if path.suffix == ".ipynb":
            text = path.read_text()
            assert not re.search(r"tests/\w", text), f"{path.name} names a file under tests/"
            assert '"hidden"' not in text and '"near-miss"' not in text, path
    readme = (handout / "README.md").read_text()
    assert "For instructors" not in readme and "make submission" in readme
    makefile = (handout / "Makefile").read_text()
    for target in ("\nlab:", "\ntest:", "\nsubmission:"):
        assert target in makefile
    assert "requirements-test.txt" not in makefile
    assert not (handout / "tests").exists()
    # `make test` in the handout: the learner's notebooks against their visible checks
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "tools.grade",
                           "notebooks", "--lessons", "02_devices"], cwd=handout,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr  # a check fails: `make test` fails
    lines = done.stdout.splitlines()
    assert lines[0].startswith("self-check: your notebooks against their own visible checks")
    assert lines[1].startswith("you  02_devices  exercise 1 (device_for_rank) check  failed  "
                               "0/1: AssertionError: ")
    assert re.fullmatch(r"you  02_devices  score 0/3  \(\d+\.\d s\)", lines[-1]), lines


# A class of four, on two real lessons -------------------------------------------------------

LESSONS = ("02_devices", "03_ddp_training")


def handout_notebook(stem):
    return student_version(nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4))


def teacher_notebook(stem):
    return nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)


def write_class(klass):
    """ada: the instructor's answers. ben: the handout untouched. cy: near misses (one
    function wrong; lesson 03's script right at 2 ranks, wrong at 3), and his second
    lesson handed in as `Copy of ...`. dee: tampered (exercise 1's check replaced by
    `assert True` on the untouched stub, exercise 2 deleted, a scratch cell that raises
    before a right answer) and one lesson missing."""
    for student in ("ada", "ben", "cy", "dee"):
        (klass / student).mkdir(parents=True)
    for stem in LESSONS:
        shutil.copy(REPO / "notebooks" / f"{stem}.ipynb", klass / "ada")
        nbformat.write(handout_notebook(stem), klass / "ben" / f"{stem}.ipynb")

    devices = teacher_notebook("02_devices")  # cy: exercise 2 answered as rank = GPU
    ex = exercise_list(devices)
    devices.cells[ex[1].solution].source = ("def physical_gpu(visible, local_rank):\n"
                                            "    return local_rank")
    nbformat.write(devices, klass / "cy" / "02_devices.ipynb")
    training = teacher_notebook("03_ddp_training")
    ex = exercise_list(training)[-1]
    training.cells[ex.solution].source = near_miss_source(
        training.cells[ex.solution].source, training.cells[ex.near_misses[0]].source)
    nbformat.write(training, klass / "cy" / "Copy of 03_ddp_training.ipynb")

    tampered = handout_notebook("02_devices")  # dee
    teacher = teacher_notebook("02_devices")
    ex = exercise_list(teacher)
    cell = {c.id: c for c in tampered.cells}
    cell[teacher.cells[ex[0].checks[0]].id].source = "assert True"
    cell[teacher.cells[ex[2].solution].id].source = teacher.cells[ex[2].solution].source
    gone = {teacher.cells[j].id for j in [ex[1].solution, *ex[1].checks]}
    tampered.cells = [c for c in tampered.cells if c.id not in gone]
    scratch = nbformat.v4.new_code_cell("import math\nmath.log(0)  # scratch")
    scratch.id = "dee-scratch"
    before = [c.id for c in tampered.cells].index(teacher.cells[ex[2].solution].id)
    tampered.cells.insert(before, scratch)
    nbformat.write(tampered, klass / "dee" / "02_devices.ipynb")


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    klass = tmp / "class"
    write_class(klass)
    out = tmp / "out"
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "tools.grade",
                           str(klass), "--lessons", ",".join(LESSONS), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    rows = list(csv.DictReader((out / "gradebook.csv").open())) \
        if (out / "gradebook.csv").exists() else []
    return done, rows, out


def by(rows, student, lesson):
    return [(r["exercise"], r["part"], r["points"], r["max_points"], r["status"])
            for r in rows if r["student"] == student and r["lesson"] == lesson]


def test_the_class_is_graded_against_the_instructors_copy(graded_class):
    done, rows, out = graded_class
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    hidden = [nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
              for stem in LESSONS]
    sources = [c.source for nb in hidden for c in nb.cells if "hidden" in c.metadata.get(
        "tags", [])]
    executed = [c.source for p in (out / "executed").rglob("*.ipynb")
                for c in nbformat.read(p, as_version=4).cells]
    assert sources and executed
    assert not [s for s in sources for text in executed if s.splitlines()[0] in text], \
        "an executed notebook that may go back to a student shows a hidden check"
    teacher = {stem: exercise_list(teacher_notebook(stem)) for stem in LESSONS}
    parts = {stem: [(str(e.number), "check") for e in exs]
             + [(str(e.number), f"hidden {h}") for e in exs for h in range(1, len(e.hidden) + 1)]
             for stem, exs in teacher.items()}
    assert all(r["message"].startswith("not attempted") for r in rows
               if r["student"] == "ben" and r["part"] == "check")
    for stem in LESSONS:  # ada: everything right, ben: nothing
        assert {r[4] for r in by(rows, "ada", stem)} == {"passed"}, by(rows, "ada", stem)
        assert {r[4] for r in by(rows, "ben", stem)} == {"failed"}, by(rows, "ben", stem)
        assert sorted(r[:2] for r in by(rows, "ada", stem)) == sorted(parts[stem])
    cy = {r[:2]: r[4] for r in by(rows, "cy", "02_devices")}
    assert cy == {("1", "check"): "passed", ("2", "check"): "failed",
                  ("3", "check"): "passed"}
    script = str(teacher["03_ddp_training"][-1].number)
    cy = {r[:2]: r[4] for r in by(rows, "cy", "03_ddp_training") if r[0] == script}
    assert cy[(script, "check")] == "passed" and cy[(script, "hidden 1")] == "failed"
    assert "Copy of 03_ddp_training.ipynb was graded as 03_ddp_training" in done.stdout
    dee = {r[:2]: r[4] for r in by(rows, "dee", "02_devices")}
    assert dee == {("1", "check"): "failed", ("2", "check"): "failed",
                   ("3", "check"): "passed"}
    assert {r[4] for r in by(rows, "dee", "03_ddp_training")} == {"missing"}
    for note in ("exercise 1: its check cell was changed; the instructor's check ran",
                 "exercise 2: its answer cell is missing (deleted?)",
                 "exercise 2: its check cell was deleted; the instructor's check ran",
                 "03_ddp_training.ipynb was not handed in"):
        assert "dee  " in done.stdout and note in done.stdout, note
    table = done.stdout[done.stdout.index("student  "):]
    assert re.search(r"^ada\s+3/3\s+(\d+)/\1\s", table, re.M), table
    assert re.search(r"^dee\s+1/3\s+-/\d+\s", table, re.M), table
    for student in ("ada", "ben", "cy", "dee"):
        assert (out / "feedback" / f"{student}.html").is_file()
    totals = {r["student"]: r for r in csv.DictReader((out / "totals.csv").open())}
    assert set(totals) == {"ada", "ben", "cy", "dee"}
    assert totals["ada"]["points"] == totals["ada"]["max_points"] != "0"
    assert float(totals["cy"]["points"]) == sum(float(r["points"]) for r in rows
                                                if r["student"] == "cy")
    report = (out / "report.md").read_text()
    cy_part = report[report.index("**cy**"):report.index("**dee**")]
    assert f"visible passed, hidden failed: 03_ddp_training exercise {script}" in cy_part
    assert "tampering: 02_devices: exercise 1: its check cell was changed" in report
    assert "**ada**" not in report and "**ben**" not in report  # nothing to note
    assert re.search(r"^\| 02_devices \| 2 \(physical_gpu\) \| check \| 1 \| 2 \| 1 \| 0 \|",
                     report, re.M), report


# Cheats: what one student's code may not do to the class ---------------------------------

CHEATS = {
    # the instructor's course and the clean copy the next students' courses come from
    "1-tom": ("from pathlib import Path\nimport sys, sysconfig\n"
              "repo = Path(sys.executable).parents[2]\n"
              "with open(repo / 'tools' / 'launch.py', 'a') as f:\n    f.write('# tom\\n')\n"
              "with open(Path.cwd().parents[1] / 'pristine' / 'tools' / 'launch.py', 'a') as f:\n"
              "    f.write('raise SystemExit\\n')\n"
              "Path(sysconfig.get_paths()['purelib'], 'ddp_grade_cheat.pth').write_text("
              "'import os\\n')\n"),
    # the processes that grade it: its kernel's parent and grandparent
    "2-mal": ("import os, signal\n"
              "grandparent = int(open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1]"
              ".split()[1])\n"
              "os.kill(grandparent, signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    # a process that leaves the session and clears its environment, to outlive grading
    "3-eve": ("import subprocess\n"
              "subprocess.Popen(['sleep', '4321'], start_new_session=True, env={})\n"),
    # a failed assert that raises KeyboardInterrupt (the backstop's signal), and a wrong answer
    "5-kai": "AssertionError = KeyboardInterrupt\n",
    # the handout's starting code, with the grader's record made to say "passed" and the
    # checks' builtins rebound
    "6-zoe": ("_real = __grader__._record\n"
              "def _passed(number, stage, part, status, *rest):\n"
              "    return _real(number, stage, part, 'passed', '', '', 0.0)\n"
              "__grader__._record = _passed\n"
              "import builtins\nbuiltins.abs = builtins.sorted = lambda *a, **k: 0\n"),
    # a script it launches (warm): does it run in the student's view, or outside it?
    "7-ivy": ("from pathlib import Path\nfrom tools.launch import launch as _launch\n"
              "Path('../ddp_scripts/ivy_probe.py').write_text(IVY_PROBE)\n"
              "_run = _launch('ddp_scripts/ivy_probe.py', nproc=None, timeout=60)\n"
              "print('the probe was', 'warm' if _run.warm else 'cold')\n"),
}
# what ivy's script looks at: the instructor's notebooks, PID 1 (in a view of its own:
# the grading process), and a file left in /tmp for later students
IVY_PROBE = """import sys
from pathlib import Path
repo = Path(sys.executable).parents[2]
try:
    (repo / 'notebooks' / '02_devices.ipynb').read_bytes()
    print('the solutions: read')
except OSError:
    print('the solutions: hidden')
init = Path('/proc/1/cmdline').read_bytes()
print('PID 1 is', 'the grading process' if b'tools.grade' in init else 'another')
Path('/tmp/ddp-grade-ivy-left').write_text('for later students')
"""


@pytest.mark.parametrize("view", ["own view", "no view"])
def test_a_cheating_student_spoils_nothing_for_the_class(tmp_path, view):
    """Cheats graded before an honest student. In a view of its own (root on Linux), the
    course is read-only and the grading process out of reach; without one, the
    instructor's course and the clean copy are put back (and the cheat named), and a
    student who kills the processes grading it stops only its own grading. Everywhere: a
    process left behind is killed; forged verdicts are the judge's; the honest student's
    grade is untouched, the gradebook is written as each student finishes, and a second
    run into the same folder keeps every grade."""
    confined = view == "own view"
    if confined and not confining():
        pytest.skip("a view of its own needs root on Linux and util-linux's unshare")
    # a warm server of this process's, named to the grading processes as `make test`'s is
    # (they must not use it: it forks outside their view)
    share_warm_server()
    environment = {**os.environ, "DDP_GRADE_CONFINE": "1" if confined else "0"}
    left_in_tmp = Path("/tmp/ddp-grade-ivy-left")
    left_in_tmp.unlink(missing_ok=True)
    klass = tmp_path / "class"
    launch_py = REPO / "tools" / "launch.py"
    before = launch_py.read_bytes()
    planted = Path(sysconfig.get_paths()["purelib"]) / "ddp_grade_cheat.pth"
    for student, cheat in [*CHEATS.items(), ("4-ada", None)]:
        (klass / student).mkdir(parents=True)
        nb = teacher_notebook("02_devices")
        if student == "6-zoe":
            nb = student_version(nb)
        if cheat:
            solution = nb.cells[exercise_list(nb, strict=False)[0].solution]
            solution.source = cheat.replace("IVY_PROBE", repr(IVY_PROBE)) + solution.source
        if student == "5-kai":  # and a wrong answer to exercise 1
            solution.source += "\ndevice_for_rank = lambda *a, **k: None\n"
        nbformat.write(nb, klass / student / "02_devices.ipynb")
    out = tmp_path / "out"
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "tools.grade", str(klass),
               "--lessons", "02_devices", "--out", str(out)]
    try:
        with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=environment) as run:
            stdout, stderr = run.communicate(timeout=900)
        done = subprocess.CompletedProcess(command, run.returncode, stdout, stderr)
    finally:
        changed = launch_py.read_bytes() != before or planted.exists()
        launch_py.write_bytes(before)
        planted.unlink(missing_ok=True)
        tmp_left = left_in_tmp.exists()
        left_in_tmp.unlink(missing_ok=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not changed, "tools/launch.py was left changed, or the planted .pth file"
    # this run's groups (their names end with its pid; another grading may run meanwhile)
    left = list(Path("/sys/fs/cgroup").glob(f"*/ddp-grade-*-{run.pid}"))
    assert not left, f"a control group was left: {left}"
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    score = {s: [r["status"] for r in rows if r["student"] == s] for s in
             ("1-tom", "2-mal", "3-eve", "4-ada", "5-kai", "6-zoe", "7-ivy")}
    assert score["5-kai"] == ["failed", "passed", "passed"], score  # the lesson went on
    kai = next(r for r in rows if r["student"] == "5-kai")
    # the check ran in the judge, where the rebinding does not reach
    assert "AssertionError: device_for_rank(5, 4, 4): expected cuda:1, got None" \
        in kai["message"], kai
    # the verdicts are the judge's: the wrapped record and the rebound builtins change nothing
    assert score["6-zoe"] == ["failed"] * 3, score
    assert score["4-ada"] == ["passed"] * 3 and score["3-eve"] == ["passed"] * 3, score
    assert score["7-ivy"] == ["passed"] * 3, score
    ivy = (out / "executed" / "7-ivy" / "02_devices.ipynb").read_text()
    assert "the probe was warm" in ivy, ivy[-3000:]
    page = (out / "feedback" / "1-tom.html").read_text()
    if confined:  # the course is read-only in its view: the first write fails its answer
        assert score["1-tom"] == ["failed", "passed", "passed"], score
        tom = next(r for r in rows if r["student"] == "1-tom")
        assert "OSError: [Errno 30] Read-only file system" in tom["message"], tom
        assert "your code changed" not in page
        # its grading process is out of its reach (init of its PID namespace): killing
        # its kernel's parent kills only its own lesson
        assert "grading stopped" not in done.stdout
        assert "2-mal  02_devices  STOPPED: DeadKernelError: Kernel died" in done.stdout
        assert "passed" not in score["2-mal"], score  # (as far as its kernel got)
        assert "in a view of the files of its own" in done.stdout
        # its warm launch came from a server inside its view, not from this process's
        assert "the solutions: hidden" in ivy and "PID 1 is the grading process" in ivy, ivy
        assert not tmp_left, "a file left in /tmp reached the machine's /tmp"
    else:  # without a view: written, found and put back
        assert score["1-tom"] == ["passed"] * 3, score  # its answers were right
        assert set(score["2-mal"]) == {"failed"}
        assert "grading stopped: the grading process was killed by signal 9" in done.stdout
        assert "your code changed the instructor&#x27;s course" in page
        assert "ddp_grade_cheat.pth" in page and "tools/launch.py" in page
        assert "your code changed the clean copy of the course" in page
    assert "1-tom  02_devices" in done.stdout
    left = subprocess.run(["pgrep", "-f", "sleep 4321"], capture_output=True, text=True)
    assert left.stdout == "", "a process left by a student outlived grading"
    assert "limits: each student's code ran with" in done.stdout
    report = (out / "report.md").read_text()
    noted = {s: report[report.index(f"**{s}**"):].split("\n- **")[0]
             for s in ("1-tom", "2-mal", "5-kai", "6-zoe")}
    assert "touches Python's start-up files" in noted["1-tom"], report
    if not confined:
        assert "changed the instructor's course" in noted["1-tom"], report
    assert "sends signals to processes" in noted["2-mal"], report
    assert "reads other processes (/proc)" in noted["2-mal"], report
    assert "rebinds `AssertionError`" in noted["5-kai"], report
    assert "uses the grader's own code" in noted["6-zoe"], report
    assert "**4-ada**" not in report and "**3-eve**" not in report, report
    totals = {r["student"]: r for r in csv.DictReader((out / "totals.csv").open())}
    assert totals["4-ada"]["percent"] == "100.0" and totals["2-mal"]["points"] == "0"
    # stopped and started again: nothing is graded twice
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                           env=environment)
    assert again.returncode == 0, again.stderr[-2000:]
    # every student but mal, whose grading was stopped (without a view): graded again
    kept = again.stdout.count("graded by an earlier run with the same notebooks, kept")
    assert kept == (7 if confined else 6), again.stdout[-3000:]
    assert confined or "\n# 2-mal\n" in again.stdout
    assert list(csv.DictReader((out / "gradebook.csv").open())) == rows


# The values of the lessons' experiments: the instructor's, as data ------------------------

FORGER = """import copy, json
from pathlib import Path
from tools.grade_kernel import to_json
fake = copy.deepcopy(plain)  # the plain run's weights, all zero: a check against them fails
fake.data["weights"] = [0.0] * len(fake.data["weights"])
forged = json.dumps(to_json({"plain": fake}))
work = Path.cwd().parents[1]  # --out's work folder: every student's course and cache
planted = 0
for folder in [work, *(p for p in work.rglob("*") if p.is_dir())]:
    for name in ("00_ddp_in_ten_minutes-7.json", "00_ddp_in_ten_minutes-7.pickle"):
        try:
            (folder / name).write_text(forged)
            planted += 1
        except OSError:
            pass
print(f"forged values planted in {planted} places")
"""


FORGED_LAUNCH = """from tools.launch import LaunchResult


def launch(script, *args, nproc=None, **options):  # what exercise 1's check reads, made up
    n = nproc or 1
    ranks = [{"samples": plain.data["ranks"][0]["samples"] // n, "weights_sha256": "same"}
             for _ in range(n)]
    return LaunchResult("forged", 0, "", 0.0, data={"world_size": n, "ranks": ranks,
                                                   "weights": plain.data["weights"]})


helper = 1
print("a forged launch in place")
"""


def test_the_experiments_values_come_from_the_instructors_run_as_data(tmp_path):
    """Two students of lesson 00. The plain run, which no answer changes, runs once with the
    instructor's notebooks and reaches each student's run from the grader's memory. The
    first student's exercise 2 answer writes forged values (the plain run's weights zeroed,
    encoded as the grader encodes them) into every folder it can reach; the second
    student's checks, which compare with the plain run, still pass. The first also hands in
    exercise 1's starting code with, after it, a cell of its own that replaces `launch` by
    one that makes up what the check reads (that cell runs: exercise 2's answer reads
    `helper`): a script exercise is checked in the judge, where no student's code ran, so
    its visible check fails and its hidden one does not run."""
    klass = tmp_path / "class"
    for student in ("1-zed", "2-ada"):
        (klass / student).mkdir(parents=True)
        nb = teacher_notebook("00_ddp_in_ten_minutes")
        ex = exercise_list(nb)
        if student == "1-zed":
            nb.cells[ex[0].solution].source = next(
                c.source for c in handout_notebook("00_ddp_in_ten_minutes").cells
                if c.id == nb.cells[ex[0].solution].id)
            forged = nbformat.v4.new_code_cell(FORGED_LAUNCH)
            forged.id = "zed-launch"
            nb.cells.insert(ex[0].solution + 1, forged)
            solution = nb.cells[ex[1].solution + 1]
            solution.source = "helper\n" + FORGER + solution.source
        nbformat.write(nb, klass / student / "00_ddp_in_ten_minutes.ipynb")
    out = tmp_path / "out"
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "tools.grade",
                           str(klass), "--lessons", "00_ddp_in_ten_minutes", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "# the instructor's answers: the lessons' experiments" in done.stdout
    executed = (out / "executed" / "1-zed" / "00_ddp_in_ten_minutes.ipynb").read_text()
    assert re.search(r"forged values planted in [1-9]\d* places", executed)
    assert "a forged launch in place" in executed
    for student in ("1-zed", "2-ada"):  # the plain and the DDP runs, not run again
        kept = (out / "executed" / student / "00_ddp_in_ten_minutes.results.jsonl").read_text()
        assert kept.count("the values it assigns, from the instructor's run") >= 2, kept
    rows = list(csv.DictReader((out / "gradebook.csv").open()))
    assert {r["student"] for r in rows} == {"1-zed", "2-ada"}  # the reference is no student
    assert {r["status"] for r in rows if r["student"] == "2-ada"} == {"passed"}, rows
    zed = {(r["exercise"], r["part"]): r for r in rows if r["student"] == "1-zed"}
    assert zed[("2", "check")]["status"] == "passed", zed
    # the real launch ran the starting code (one process), and the hidden check did not run
    assert zed[("1", "check")]["status"] == zed[("1", "hidden 1")]["status"] == "failed", zed
    assert "the processes never joined one job" in zed[("1", "check")]["message"], zed
    assert zed[("1", "hidden 1")]["message"] == "not run: the visible check failed", zed


def test_values_decode_as_data_only():
    import json

    from tools.grade_kernel import from_json, to_json
    from tools.launch import LaunchResult

    run = LaunchResult("torchrun x.py", 0, "out\n", 1.5, data={"ranks": [{"a": 1}]},
                       stderr_by_rank={0: "err"})
    values = {"run": run, "pair": (1, 2.5), "seen": {3}, "raw": b"\0x", "z": 1j,
              "keys": {1: "one", (2, 3): "two"}, "__x": None}
    assert from_json(json.loads(json.dumps(to_json(values)))) == values
    for bad in ({"__record__": "os:system", "fields": {}},  # not the course's
                {"__record__": "tools.launch:Path", "fields": {}},  # not a dataclass
                {"__record__": "tools.launch:LaunchResult", "fields": {"evil": 1}},
                {"__reduce__": ["os.system", ["true"]]}):
        with pytest.raises(ValueError):
            from_json(bad)
    with pytest.raises(TypeError):
        to_json({"f": print})


def test_executed_notebooks_come_back_small(tmp_path):
    """A student's printing does not swell the notebook they get back: a cell's outputs are
    cut to OUTPUT_CHARS, a long stream keeping its start and its end, the rest counted."""
    from tools.grade import OUTPUT_CHARS, without_hidden_sources

    nb = nbformat.v4.new_notebook()
    loud = nbformat.v4.new_code_cell("print('x' * 5_000_000)")
    loud.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="start" + "x" * 5_000_000 + "end\n")]
    pictures = nbformat.v4.new_code_cell("show()")
    pictures.outputs = [nbformat.v4.new_output("stream", name="stdout", text="drawn\n")] + [
        nbformat.v4.new_output("display_data", data={"image/png": "A" * 60_000})
        for _ in range(40)]
    nb.cells = [loud, pictures]
    nbformat.write(nb, tmp_path / "00_lesson.ipynb")
    without_hidden_sources(tmp_path)
    assert (tmp_path / "00_lesson.ipynb").stat().st_size < 3 * OUTPUT_CHARS
    back = nbformat.read(tmp_path / "00_lesson.ipynb", as_version=4)
    text = back.cells[0].outputs[0].text
    assert text.startswith("start") and text.endswith("end\n") and "characters left out" in text
    kinds = [o.output_type for o in back.cells[1].outputs]
    assert kinds == ["stream", "display_data", "stream"], kinds  # one picture fits
    counted = re.fullmatch(r"\[39 output\(s\), ([\d,]+) characters, left out\]\n",
                           back.cells[1].outputs[-1].text)
    assert counted and int(counted[1].replace(",", "")) > 39 * 60_000, back.cells[1].outputs[-1]
