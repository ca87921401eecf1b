"""`make student`: write the student version of the course (solutions replaced by stubs).

    python -m tools.student [--dest build/student]

The result is a self-contained copy of the course without its tests: hand it out as
it is, or zip it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import nbformat

from tools.course import COURSE_PARTS, REPO, lessons
from tools.exercises import exercises, student_version

HANDOUT_FILES = ("README.md", "requirements.txt", "Makefile")


def write_student_course(dest: Path) -> list[Path]:
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    for part in COURSE_PARTS:
        shutil.copytree(REPO / part, dest / part,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    for name in HANDOUT_FILES:
        shutil.copy2(REPO / name, dest / name)
    written = []
    for path in lessons():
        nb = nbformat.read(path, as_version=4)
        target = dest / "notebooks" / path.name
        nbformat.write(student_version(nb), target)
        written.append(target)
        print(f"{target}: {len(exercises(nb))} exercises stubbed")
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
