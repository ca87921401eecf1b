"""`make course`: execute every lesson with papermill, render each to HTML, and write an
index page. Prints a progress line per lesson and a final table; exits 1 if any failed.

    python -m tools.run_course [--world-size N] [--only 01] [--build build]
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import time
from pathlib import Path

import nbformat

from tools import site
from tools.course import REPO, execute, lessons, make_workspace, title, why_not_here

ERROR_TAIL_LINES = 30


def index_intro(world_size: int) -> str:
    import torch

    return (f"Every lesson below was executed on {time.strftime('%Y-%m-%d %H:%M')} with world "
            f"size {world_size}, torch {html.escape(torch.__version__)}.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int,
                        default=int(os.environ.get("WORLD_SIZE") or 2))
    parser.add_argument("--only", default="", help="run only lessons whose name contains this")
    parser.add_argument("--build", type=Path, default=REPO / "build")
    args = parser.parse_args(argv)

    chosen = [p for p in lessons() if args.only in p.name]
    workspace = make_workspace(args.build / "course")
    executed_dir, html_dir = args.build / "executed", args.build / "html"
    html_dir.mkdir(parents=True, exist_ok=True)
    notebooks = {path: nbformat.read(path, as_version=4) for path in chosen}
    # The navigation lists the lessons of this run (all of them unless --only).
    pages = site.site_pages([(path.with_suffix(".html").name, title(nb))
                             for path, nb in notebooks.items()])
    rows = []
    for i, path in enumerate(chosen, start=1):
        print(f"[{i}/{len(chosen)}] {path.name}: running", flush=True)
        nb = notebooks[path]
        executed = executed_dir / path.name
        start = time.monotonic()
        reason = why_not_here(path)
        try:
            if reason:  # lesson 32 off Linux or without root: rendered, not run
                print(f"{path.name} skipped: {reason}", flush=True)
                executed.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, executed)
                status = "skipped"
            else:
                execute(nb, executed, workspace, world_size=args.world_size)
                status = "ok"
        except Exception as error:  # report every lesson, then fail at the end
            status = "FAILED"
            tail = "\n".join(str(error).splitlines()[-ERROR_TAIL_LINES:])
            print(f"{path.name} failed:\n{tail}", flush=True)
        seconds = time.monotonic() - start
        page = path.with_suffix(".html").name
        if executed.exists():
            site.render_lesson(executed, html_dir / page, workspace / "notebooks", pages)
        rows.append({"name": path.name, "title": title(nb), "status": status,
                     "description": site.lesson_description(path.stem),
                     "seconds": seconds, "html": page})
        print(f"[{i}/{len(chosen)}] {path.name}: {status} in {seconds:.1f} s", flush=True)

    site.write_index(rows, html_dir / "index.html", pages, index_intro(args.world_size))
    width = max([len(r["name"]) for r in rows] + [8])
    print(f"\n{'notebook':<{width}}  status  seconds")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<6}  {r['seconds']:7.1f}")
    total = sum(r["seconds"] for r in rows)
    print(f"{'total':<{width}}  {'':<6}  {total:7.1f}")
    print(f"\nHTML: {html_dir / 'index.html'}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
