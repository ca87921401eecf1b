"""`make student`: write the student version of the course (solutions replaced by stubs).

    python -m tools.student [--dest build/student]

The result is a repository for students: the course without its tests, without the
solutions and without the hidden checks; hand it out as it is, or zip it. A script that a
solution cell writes with `%%writefile` is rewritten from the student's cells too (the
stub, not the answer). Its README and Makefile are the students' own (tools/handout/):
`make lab` opens the lessons, `make test` checks the answers against the visible checks,
`make submission` zips the notebooks to hand in.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import nbformat

from tools.course import COURSE_PARTS, REPO, lessons
from tools.exercises import exercises, student_version, tags, written_scripts

HANDOUT = REPO / "tools" / "handout"  # the students' README.md and Makefile


def write_stubbed_scripts(nb, notebook_dir: Path, root: Path) -> list[Path]:
    """Rewrite, from a student notebook's `%%writefile` cells (and their `-a` pieces), every
    script one of its solution cells writes; the other scripts are left as copied."""
    stubbed = []
    for target, (text, cells) in written_scripts(nb, notebook_dir).items():
        if not target.is_relative_to(root.resolve()):
            raise ValueError(f"a %%writefile cell writes outside the course: {target}")
        if any("solution" in tags(cell) for cell in cells):
            target.write_text(text)
            stubbed.append(target)
    return sorted(stubbed)


def write_student_course(dest: Path) -> list[Path]:
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for part in COURSE_PARTS:
        shutil.copytree(REPO / part, dest / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints",
                                                      "handout"))
    shutil.copy2(REPO / "requirements.txt", dest / "requirements.txt")
    for name in ("README.md", "Makefile"):
        shutil.copy2(HANDOUT / name, dest / name)
    written = []
    for path in lessons():
        nb = nbformat.read(path, as_version=4)
        target = dest / "notebooks" / path.name
        student = student_version(nb)
        nbformat.write(student, target)
        written.append(target)
        scripts = write_stubbed_scripts(student, target.parent, dest)
        also = "".join(f", {s.relative_to(dest.resolve())} stubbed" for s in scripts)
        print(f"{target}: {len(exercises(nb))} exercises stubbed{also}")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=REPO / "build" / "student")
    args = parser.parse_args(argv)
    write_student_course(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
