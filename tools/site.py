"""The rendered course (`make course`): one HTML page per executed lesson and an index,
every page with the lesson list and previous / next links. Plain HTML and CSS, no
JavaScript, nothing fetched from the internet: the pages work offline, from `file://`.

nbconvert's `lab` template loads require.js and MathJax from a CDN (and mermaid.js when a
notebook has a mermaid diagram); the lessons need none of them (no math, no widgets, no
mermaid), so the page template below drops those scripts and embeds the images.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import re
from pathlib import Path

from tools import lessons as registry

# What each lesson teaches, one line each, for the index (tools/lessons.py).
DESCRIPTIONS = {lesson.stem: lesson.summary for lesson in registry.LESSONS}

INDEX = ("index.html", "Course index")

CSS = """
.ddp-nav { font-family: system-ui, sans-serif; font-size: 14px; line-height: 1.35;
  background: #f6f7f9; border-bottom: 1px solid #d8dbe0; padding: .6em 1em; }
.ddp-nav h2 { font-size: 15px; margin: .2em 0 .5em; }
.ddp-nav ol { list-style: none; margin: 0; padding: 0; }
.ddp-nav li { margin: 0; }
.ddp-nav li a { display: block; padding: .25em .5em; border-radius: 4px;
  color: #1a4d8f; text-decoration: none; }
.ddp-nav li a:hover { background: #e3e8f0; }
.ddp-nav li a[aria-current="page"] { background: #1a4d8f; color: #fff; font-weight: 600; }
.ddp-prevnext { display: flex; justify-content: space-between; gap: 1em;
  font-family: system-ui, sans-serif; font-size: 14px; margin: .8em 0; }
.ddp-prevnext a { color: #1a4d8f; text-decoration: none; }
.ddp-prevnext a:hover { text-decoration: underline; }
.ddp-prevnext .ddp-next { margin-left: auto; text-align: right; }
.ddp-folded > summary { cursor: pointer; font-family: system-ui, sans-serif; font-size: 14px;
  color: #1a4d8f; padding: .3em 0; }
@media (min-width: 60em) {
  .ddp-nav { position: fixed; top: 0; left: 0; bottom: 0; width: 15em; overflow-y: auto;
    border-bottom: none; border-right: 1px solid #d8dbe0; box-sizing: border-box; }
  body > main, body > .ddp-index { margin-left: 15em; }
}
"""

INDEX_CSS = """
body { font-family: system-ui, sans-serif; margin: 0; }
.ddp-index { max-width: 52em; padding: 1em 2em; }
.ddp-index table { border-collapse: collapse; }
.ddp-index td, .ddp-index th { padding: .45em .8em; text-align: left; vertical-align: top;
  border-bottom: 1px solid #e3e6ea; }
.ddp-index td.num { text-align: right; }
.ddp-index .desc { color: #444; font-size: 14px; }
.ddp-index .why { font-weight: 600; font-size: 14px; }
.ddp-index h2 { font-size: 18px; margin: 1.4em 0 .4em; }
"""

# The page template: nbconvert's lab page without its CDN scripts, with our navigation.
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{% block extra_css %}<style type="text/css">{{ resources.ddp_css }}</style>{% endblock extra_css %}
{%- block body_header -%}
<body class="jp-Notebook" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
{{ resources.ddp_nav }}
<main>
{{ resources.ddp_prevnext }}
{%- endblock body_header -%}
{% block body_footer %}
{{ resources.ddp_prevnext }}
</main>
</body>
{% endblock body_footer %}
{% block input_group -%}
{%- if cell.metadata.get('jupyter', {}).get('source_hidden') -%}
<details class="ddp-folded">
<summary>{{ cell.metadata.get('folded', 'The code') | escape_html }}</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{%- endblock input_group %}
{% block data_png scoped %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}"
alt="{{ cell.metadata.get('alt', '') | escape_html }}">
</div>
{%- endblock data_png %}
"""


def lesson_description(stem: str) -> str:
    return DESCRIPTIONS.get(stem, "")


def nav(pages: list[tuple[str, str]], current: str) -> str:
    """The lesson list: `pages` is [(file name, title)], the index first; `current` is
    the file name of the page it goes on."""
    marked = ' aria-current="page"'
    items = "\n".join(
        f'<li><a href="{html.escape(name)}"{marked if name == current else ""}>'
        f'{html.escape(text)}</a></li>' for name, text in pages)
    return (f'<nav class="ddp-nav" aria-label="Lessons"><h2>ddp-course</h2>\n'
            f'<ol>\n{items}\n</ol></nav>')


def prevnext(pages: list[tuple[str, str]], current: str) -> str:
    names = [name for name, _ in pages]
    i = names.index(current)
    parts = []
    if i > 0:
        name, text = pages[i - 1]
        parts.append(f'<a class="ddp-prev" rel="prev" href="{html.escape(name)}">'
                     f'&larr; {html.escape(text)}</a>')
    if i + 1 < len(pages):
        name, text = pages[i + 1]
        parts.append(f'<a class="ddp-next" rel="next" href="{html.escape(name)}">'
                     f'{html.escape(text)} &rarr;</a>')
    return f'<nav class="ddp-prevnext" aria-label="Previous and next">{"".join(parts)}</nav>'


def site_pages(lesson_pages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every page of the site in reading order: the index, then the lessons."""
    return [INDEX, *lesson_pages]


def render_lesson(executed: Path, dest: Path, notebook_dir: Path,
                  pages: list[tuple[str, str]]) -> None:
    """Render an executed notebook to `dest` (its name must be one of `pages`)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", template_file="ddp_page.html.j2",
                            extra_loaders=[DictLoader({"ddp_page.html.j2": TEMPLATE})],
                            embed_images=False)  # embed_images() below embeds them
    body, _ = exporter.from_filename(str(executed), resources={
        "metadata": {"path": str(notebook_dir)},
        "ddp_css": CSS, "ddp_nav": nav(pages, dest.name),
        "ddp_prevnext": prevnext(pages, dest.name)})
    # Links between lessons point at notebooks; in the rendered course they point at pages.
    body = re.sub(r'href="((?:\./)?\d\d_[\w-]+)\.ipynb', r'href="\1.html', body)
    dest.write_text(embed_images(body, notebook_dir))


def embed_images(body: str, notebook_dir: Path) -> str:
    """Embed the images that nbconvert left as links. nbconvert 7.17 embeds only files
    inside the notebook's own folder, and the lessons' diagrams are in `../images/`."""
    def embed(match: re.Match) -> str:
        src = html.unescape(match.group(2))
        path = (notebook_dir / src).resolve()
        if "://" in src or src.startswith("data:") or not path.is_file():
            return match.group(0)  # left as it is: the site test reports it if it is broken
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"{match.group(1)}data:{mime};base64,{data}{match.group(3)}"

    return re.sub(r'(<img\b[^>]*?\bsrc=")([^"]+)(")', embed, body)


def write_index(rows: list[dict], dest: Path, pages: list[tuple[str, str]],
                intro: str) -> None:
    """`rows`: one dict per lesson with html, title, description, status, seconds. The
    lessons are shown as the course map shows them (tools/course_map.py): the core path in
    order, then the topics; a lesson the map does not know goes last."""
    from tools import course_map

    by_stem = {Path(r["html"]).stem: r for r in rows}
    mapped = {m["stem"]: m for m in course_map.rows(seconds={})}
    groups = [("The core path, in order", [m["stem"] for m in mapped.values()
                                          if m["group"] == "core"])]
    groups += [(f"Topic: {group}", [stem for stem, _ in entries])
               for group, entries in course_map.topics()]
    groups.append(("Other lessons", [stem for stem in by_stem if stem not in mapped]))

    def row(r, m):
        minutes = f"{m['minutes']} min" if m else ""
        why = f'<br><span class="why">{html.escape(m["why"])}</span>' if m else ""
        return (f'<tr><td><a href="{html.escape(r["html"])}">{html.escape(r["title"])}</a>'
                f'{why}<br><span class="desc">{html.escape(r["description"])}</span></td>'
                f'<td class="num">{minutes}</td><td>{html.escape(r["status"])}</td>'
                f'<td class="num">{r["seconds"]:.1f}</td></tr>')

    tables = []
    for heading, stems in groups:
        body = "\n".join(row(by_stem[s], mapped.get(s)) for s in stems if s in by_stem)
        if body:
            tables.append(f"<h2>{html.escape(heading)}</h2>\n<table><tr><th>lesson</th>"
                          f"<th>reading</th><th>status</th><th>seconds</th></tr>\n{body}\n"
                          "</table>")
    items = "\n".join(tables)
    dest.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>ddp-course</title>
<style>{CSS}{INDEX_CSS}</style></head>
<body>
{nav(pages, dest.name)}
<div class="ddp-index">
{prevnext(pages, dest.name)}
<h1>ddp-course: PyTorch DistributedDataParallel from first principles</h1>
<p>{intro}</p>
<p>New to DDP? Take the core path in order: it gets a training script running with DDP, right
and faster. The topics are for when you need them. Reading: minutes for the main text and its
code; seconds: this run's time to execute the lesson.</p>
{items}
{prevnext(pages, dest.name)}
</div></body></html>
""")
