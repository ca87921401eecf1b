"""`make course`: execute every lesson with papermill, render each to HTML, and write an
index page. Prints a progress line per lesson and a final table; exits 1 if any failed.

    python -m tools.run_course [--world-size N] [--only 01] [--build build]
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import time
from pathlib import Path

import nbformat

from tools.course import REPO, blurb, execute, lessons, make_workspace, title

ERROR_TAIL_LINES = 30


def render_html(executed: Path, dest: Path, notebook_dir: Path) -> None:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(embed_images=True)  # the HTML page carries its diagrams
    body, _ = exporter.from_filename(str(executed),
                                     resources={"metadata": {"path": str(notebook_dir)}})
    # Links between lessons point at notebooks; in the rendered course they point at pages.
    body = re.sub(r'href="((?:\./)?\d\d_[\w-]+)\.ipynb', r'href="\1.html', body)
    dest.write_text(body)


def write_index(rows, dest: Path, world_size: int) -> None:
    import torch

    items = "\n".join(
        f'<tr><td><a href="{html.escape(r["html"])}">{html.escape(r["title"])}</a><br>'
        f'<small>{html.escape(r["blurb"])}</small></td>'
        f'<td>{r["status"]}</td><td>{r["seconds"]:.1f}</td></tr>' for r in rows)
    dest.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ddp-course</title>
<style>body{{font-family:sans-serif;max-width:48em;margin:2em auto}}
td,th{{padding:.3em 1em;text-align:left}}</style></head>
<body><h1>ddp-course: PyTorch DistributedDataParallel from first principles</h1>
<p>Every lesson below was executed on {time.strftime('%Y-%m-%d %H:%M')} with world size
{world_size}, torch {html.escape(torch.__version__)}.</p>
<table><tr><th>lesson</th><th>status</th><th>seconds</th></tr>
{items}
</table></body></html>
""")


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
    rows = []
    for i, path in enumerate(chosen, start=1):
        print(f"[{i}/{len(chosen)}] {path.name}: running", flush=True)
        nb = nbformat.read(path, as_version=4)
        executed = executed_dir / path.name
        start = time.monotonic()
        try:
            execute(nb, executed, workspace, world_size=args.world_size)
            status = "ok"
        except Exception as error:  # report every lesson, then fail at the end
            status = "FAILED"
            tail = "\n".join(str(error).splitlines()[-ERROR_TAIL_LINES:])
            print(f"{path.name} failed:\n{tail}", flush=True)
        seconds = time.monotonic() - start
        page = path.with_suffix(".html").name
        if executed.exists():
            render_html(executed, html_dir / page, workspace / "notebooks")
        rows.append({"name": path.name, "title": title(nb), "blurb": blurb(nb), "status": status,
                     "seconds": seconds, "html": page})
        print(f"[{i}/{len(chosen)}] {path.name}: {status} in {seconds:.1f} s", flush=True)

    write_index(rows, html_dir / "index.html", args.world_size)
    width = max([len(r["name"]) for r in rows] + [8])
    print(f"\n{'notebook':<{width}}  status  seconds")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<6}  {r['seconds']:7.1f}")
    total = sum(r["seconds"] for r in rows)
    print(f"{'total':<{width}}  {'':<6}  {total:7.1f}")
    print(f"\nHTML: {html_dir / 'index.html'}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
