"""The rendered course (`make course`'s build/html) checked in headless Chromium: every page
loads offline, every link resolves, every image loads, every page has the lesson list and
the right previous / next links. Also: the kernel runs without ipykernel's TCP warning.

The pages are rendered from the lessons test_notebooks.py executed earlier in the session
(tests/conftest.py keeps them); a lesson it did not execute (this file run alone, or with -k)
is taken from SITE_EXECUTED when that names a folder of executed lessons (`make course`'s
build/executed), else executed here as `make course` runs it (about 5 minutes for all).
"""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from tools import site
from tools.course import REPO, execute, lessons, title, why_not_here

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# As root in a container, without a network: no sandbox, no GPU, no background traffic.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic"]
PAGE_TIMEOUT_MS = 60_000  # one page (about 0.5 MB, images inline) loads in well under 1 s
TCP_WARNING = "Kernel is running over TCP without encryption"
PAGE = r"""() => ({
  links: [...document.querySelectorAll('a[href]')].map(a => ({
    href: a.getAttribute('href'), url: a.href, text: a.textContent.trim().slice(0, 60)})),
  images: [...document.images].map(img => ({
    alt: img.alt.slice(0, 60), loaded: img.complete && img.naturalWidth > 0})),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
    .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
  nav: [...document.querySelectorAll('nav.ddp-nav li a')].map(a => ({
    href: a.getAttribute('href'), text: a.textContent.trim(),
    current: a.getAttribute('aria-current')})),
  prev: [...document.querySelectorAll('a[rel=prev]')].map(a => a.getAttribute('href')),
  next: [...document.querySelectorAll('a[rel=next]')].map(a => a.getAttribute('href')),
  details: [...document.querySelectorAll('details')].map(d => ({
    summary: (d.querySelector('summary') || {textContent: ''}).textContent.trim().slice(0, 60),
    open: d.open,
    inside: d.textContent.length
      - (d.querySelector('summary') || {textContent: ''}).textContent.length})),
  rows: [...document.querySelectorAll('.ddp-index tr')].map(tr => ({
    href: tr.querySelector('a') && tr.querySelector('a').getAttribute('href'),
    text: tr.innerText.replace(/\s+/g, ' ')})),
})"""


def test_every_lesson_has_a_one_line_description():
    stems = {path.stem for path in lessons()}
    assert set(site.DESCRIPTIONS) == stems, (
        f"missing: {sorted(stems - set(site.DESCRIPTIONS))}, "
        f"extra: {sorted(set(site.DESCRIPTIONS) - stems)}")
    for stem, text in site.DESCRIPTIONS.items():
        assert "\n" not in text and 40 <= len(text) <= 200 and text.endswith("."), stem


def image_count(nb) -> int:
    """Images the page of an executed notebook shows: image outputs and markdown images."""
    outputs = sum(1 for cell in nb.cells for output in cell.get("outputs", [])
                  if any(key.startswith("image/") for key in output.get("data", {})))
    markdown = sum(cell.source.count("![") + cell.source.count("<img")
                   for cell in nb.cells if cell.cell_type == "markdown")
    return outputs + markdown


@pytest.fixture(scope="module")
def built_site(executed_lessons, workspace, tmp_path_factory):
    """build/html as `make course` writes it: the executed lessons rendered by
    tools.site (the proof cells test_notebooks.py added are dropped first)."""
    root = tmp_path_factory.mktemp("site")
    executed_dir, html_dir = root / "executed", root / "html"
    executed_dir.mkdir()
    html_dir.mkdir()
    sources = {path: nbformat.read(path, as_version=4) for path in lessons()}
    pages = site.site_pages([(path.with_suffix(".html").name, title(nb))
                             for path, nb in sources.items()])
    rows, images, executed_here = [], {}, []
    given = Path(os.environ["SITE_EXECUTED"]) if os.environ.get("SITE_EXECUTED") else None
    for path, nb in sources.items():
        executed = executed_dir / path.name
        done = None
        if path.stem in executed_lessons:
            done = nbformat.reads(executed_lessons[path.stem].decode(), as_version=4)
        elif given and (given / path.name).is_file():
            done = nbformat.read(given / path.name, as_version=4)
        if done is None and why_not_here(path):  # lesson 32 off Linux or without root
            done = nb
        if done is not None:
            done.cells = [cell for cell in done.cells
                          if "exercise-proof" not in cell.metadata.get("tags", [])]
            nbformat.write(done, executed)
            seconds = 0.0
        else:
            seconds = execute(nb, executed, workspace)
            executed_here.append(f"{path.stem} {seconds:.0f} s")
        page = path.with_suffix(".html").name
        site.render_lesson(executed, html_dir / page, workspace / "notebooks", pages)
        images[page] = image_count(nbformat.read(executed, as_version=4))
        rows.append({"html": page, "title": title(nb), "status": "ok", "seconds": seconds,
                     "description": site.lesson_description(path.stem)})
    site.write_index(rows, html_dir / "index.html", pages, "Rendered by tests/test_site.py.")
    images["index.html"] = 0
    cached = sorted(set(executed_lessons) & {path.stem for path in sources})
    print(f"\nsite: {len(cached)} lessons executed by test_notebooks.py ({', '.join(cached)}); "
          f"executed here: {', '.join(executed_here) or 'none'}")
    return html_dir, pages, images


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium: the system's own (never a browser Playwright downloads)."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"tests/test_site.py needs Chromium at {CHROMIUM}, which is missing. Install "
                    f"it: on Debian/Ubuntu `apt-get install -y --no-install-recommends chromium` "
                    f"as root (`make test` does this by itself when run as root), or set "
                    f"CHROMIUM=/path/to/chromium.")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("tests/test_site.py needs Playwright: .venv/bin/pip install -r "
                    "requirements-test.txt (`make test` does this by itself)")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                             headless=True, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def visit(browser, url: str) -> dict:
    """Load one page with every request off this machine refused; what the page has."""
    context = browser.new_context(viewport={"width": 1366, "height": 800})
    outside, failed, errors = [], [], []

    def only_local(route):
        if route.request.url.startswith(("file:", "data:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    try:
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        context.route("**/*", only_local)
        page = context.new_page()
        page.on("requestfailed", lambda request: failed.append(request.url[:100]))
        page.on("pageerror", lambda error: errors.append(str(error)))
        response = page.goto(url, wait_until="load", timeout=PAGE_TIMEOUT_MS)
        found = page.evaluate(PAGE)
    finally:
        context.close()
    return {**found, "ok": response is None or response.ok, "outside": outside,
            "failed": failed, "errors": errors}


# The backstop covers the fixture: run alone (no lessons cached), it executes the course
# (about 5 minutes on 2 idle cores, 8 loaded).
@pytest.mark.timeout(1800)
def test_site_in_chromium(built_site, browser):
    html_dir, pages, images = built_site
    start = time.monotonic()
    seen = {name: visit(browser, (html_dir / name).as_uri()) for name, _ in pages}
    problems, external = [], set()
    for i, (name, _) in enumerate(pages):
        page = seen[name]
        if not page["ok"] or page["failed"] or page["errors"]:
            problems.append(f"{name}: did not load cleanly: {page['failed']} {page['errors']}")
        if page["outside"]:
            problems.append(f"{name}: fetched from outside (the pages must work offline): "
                            f"{page['outside']}")
        # Every link resolves: a page of the site, and an element with that id on it.
        for link in page["links"]:
            parts = urlsplit(link["url"])
            if parts.scheme in ("http", "https"):
                external.add(link["url"])  # listed, never fetched: there is no network
                continue
            target = Path(unquote(parts.path))
            if parts.scheme != "file" or target.parent != html_dir or target.name not in seen:
                problems.append(f"{name}: link {link['href']!r} ({link['text']!r}) "
                                f"does not lead to a page of the site")
            # An element whose id is the fragment as written, or percent-decoded (the HTML
            # standard's order; nbconvert writes heading ids percent-encoded: "00-%C2%B7-...").
            elif parts.fragment and not {parts.fragment, unquote(parts.fragment)} & set(
                    seen[target.name]["ids"]):
                problems.append(f"{name}: link {link['href']!r} ({link['text']!r}): "
                                f"no element with that id on {target.name}")
        # Every image loaded, and every image the notebook has is on the page.
        broken = [image["alt"] for image in page["images"] if not image["loaded"]]
        if broken:
            problems.append(f"{name}: images not loaded: {broken}")
        if len(page["images"]) != images[name]:
            problems.append(f"{name}: {len(page['images'])} images on the page, "
                            f"{images[name]} in the notebook")
        # A deep dive is folded and holds its text (a block whose text falls outside its
        # <details>, as nbconvert's image embedding made it, would show unfolded).
        for block in page["details"]:
            if block["open"] or block["inside"] < 40:
                problems.append(f"{name}: deep dive {block['summary']!r} is open or empty "
                                f"({block['inside']} characters inside)")
        # Navigation: every page listed in order, this one marked; previous and next.
        expected = [{"href": href, "text": text, "current": "page" if href == name else None}
                    for href, text in pages]
        if page["nav"] != expected:
            problems.append(f"{name}: lesson list {page['nav']} != {expected}")
        prev = [pages[i - 1][0]] if i > 0 else []
        after = [pages[i + 1][0]] if i + 1 < len(pages) else []
        if sorted(set(page["prev"])) != prev or sorted(set(page["next"])) != after:
            problems.append(f"{name}: previous {page['prev']}, next {page['next']}; "
                            f"expected {prev}, {after}")
        if page["prev"] and len(page["prev"]) != 2 or page["next"] and len(page["next"]) != 2:
            problems.append(f"{name}: previous / next links not both at top and bottom")
    # The index: a row per lesson, its link, title and one-line description.
    rows = {row["href"]: row["text"] for row in seen["index.html"]["rows"] if row["href"]}
    for name, text in pages[1:]:
        description = site.lesson_description(Path(name).stem)
        if not (description and text in rows.get(name, "") and description in rows[name]):
            problems.append(f"index.html: no row with {name}, {text!r} and its description: "
                            f"{rows.get(name)!r}")
    print(f"\nsite: {len(seen)} pages, {sum(len(p['links']) for p in seen.values())} links, "
          f"{sum(len(p['images']) for p in seen.values())} images checked in "
          f"{time.monotonic() - start:.1f} s; external links (not fetched): "
          f"{sorted(external) or 'none'}")
    assert sum(images.values()) > 0, "no page has an image: the image check checked nothing"
    assert not problems, "\n".join(problems)


KERNEL_PROBE = """\
import sys, time
from pathlib import Path
from ipykernel.kernelapp import IPKernelApp
app = IPKernelApp.instance()
Path(me).write_text(app.connection_file)
deadline = time.monotonic() + 60  # both kernels are alive at once: each waits for the other
while not Path(other).exists():
    assert time.monotonic() < deadline, "the other kernel never started"
    time.sleep(0.05)
print(app.transport, app.connection_file)
"""
EXECUTE = """\
import sys, nbformat
sys.path.insert(0, {repo!r})
from tools.course import execute
execute(nbformat.read({nb!r}, as_version=4), {out!r}, {ws!r},
        extra_parameters={{"me": {me!r}, "other": {other!r}}})
"""


def test_kernels_run_over_ipc_without_the_tcp_warning_and_never_collide(tmp_path):
    """tools.course.execute starts the kernel on IPC sockets in a folder of its own: no
    TCP warning, and two executions at once in one workspace do not share sockets."""
    parameters = nbformat.v4.new_code_cell('me = ""\nother = ""')
    parameters.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[parameters, nbformat.v4.new_code_cell(KERNEL_PROBE)])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}
    notebook = tmp_path / "probe.ipynb"
    nbformat.write(nb, notebook)
    workspace = tmp_path / "ws"
    (workspace / "notebooks").mkdir(parents=True)

    # Control, run alongside: papermill's default (TCP) prints the warning where we look.
    control = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""\
            import papermill
            papermill.execute_notebook({str(notebook)!r}, {str(tmp_path / 'tcp.ipynb')!r},
                parameters={{"me": {str(tmp_path / 'a')!r}, "other": {str(tmp_path / 'a')!r}}},
                kernel_name="python3", progress_bar=False)""")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = []
    for me, other in (("b", "c"), ("c", "b")):
        code = EXECUTE.format(repo=str(REPO), nb=str(notebook), out=str(tmp_path / f"{me}.ipynb"),
                              ws=str(workspace), me=str(tmp_path / me),
                              other=str(tmp_path / other))
        runs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    connection_files = []
    for me, run in zip("bc", runs):
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr[-2000:]
        assert TCP_WARNING not in stderr and "WARNING" not in stderr, stderr[-2000:]
        output = nbformat.read(tmp_path / f"{me}.ipynb", as_version=4).cells[-1].outputs
        transport, connection_file = output[0]["text"].split()
        assert transport == "ipc"
        connection_files.append(Path(connection_file))
    _, stderr = control.communicate(timeout=120)
    assert control.returncode == 0, stderr[-2000:]
    assert TCP_WARNING in stderr, stderr[-2000:]
    folders = {path.parent for path in connection_files}
    assert len(folders) == 2, f"two kernels shared a socket folder: {connection_files}"
    assert not any(folder.exists() for folder in folders), "socket folders left behind"
    assert list((workspace / "notebooks").iterdir()) == [], "files left in the lesson folder"


def test_stale_kernel_folders_are_removed_and_live_ones_kept(tmp_path):
    """A run killed before its `finally` leaves its socket folder behind: the next run
    removes it, once it is old and nothing listens on it; a live kernel's folder stays."""
    import socket

    from tools.course import KERNEL_FOLDER_PREFIX, remove_stale_kernel_folders

    folders = {name: tmp_path / f"{KERNEL_FOLDER_PREFIX}{name}"
               for name in ("live", "dead", "empty", "young")}
    for folder in folders.values():
        folder.mkdir()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(folders["live"] / "k-1"))
    live.listen()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(folders["dead"] / "k-1"))  # its file stays, nobody listens any more
    (tmp_path / "unrelated").mkdir()
    old = time.time() - 3600
    for name in ("live", "dead", "empty"):
        os.utime(folders[name], (old, old))
    try:
        removed = remove_stale_kernel_folders(tmp=tmp_path)
    finally:
        live.close()
    assert sorted(removed) == sorted([folders["dead"], folders["empty"]])
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [folders["live"].name, folders["young"].name, "unrelated"])
