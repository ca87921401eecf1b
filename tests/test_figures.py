"""Every figure a lesson draws from its runs has alt text: the cell that calls a function of
tools/plots.py carries it in its metadata (`alt`), and the rendered page puts it on the
image, where a screen reader finds it."""

import base64
import json
import re

import nbformat
import pytest
from bs4 import BeautifulSoup

from tools import site
from tools.course import REPO, lessons

PLOTS = {name for name in re.findall(r"^def (\w+)\(", (REPO / "tools" / "plots.py").read_text(),
                                     re.M) if not name.startswith("_")}
LESSONS = lessons()


def figure_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code" and any(
        re.search(rf"\b{name}\(", cell.source) for name in PLOTS)
        and not cell.source.startswith("%%writefile")]  # a script may share a name


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_figure_cell_has_alt_text(path):
    nb = nbformat.read(path, as_version=4)
    missing = [cell.id for cell in figure_cells(nb)
               if len(cell.metadata.get("alt", "").split()) < 8]
    assert not missing, (f"cells drawing a figure without alt text (at least 8 words in the "
                         f"cell's metadata 'alt'): {missing}")


def test_the_page_puts_the_cells_alt_text_on_its_image(tmp_path):
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n not really a picture").decode()
    cell = nbformat.v4.new_code_cell("same_training(losses)")
    cell.metadata["alt"] = 'Two panels: the "loss" per step & its distance'
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png})]
    plain = nbformat.v4.new_code_cell("plot()")
    plain.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png})]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · Test"),
                                         cell, plain])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    executed = tmp_path / "99_test.ipynb"
    executed.write_text(json.dumps(nb))
    dest = tmp_path / "99_test.html"
    site.render_lesson(executed, dest, tmp_path, [("index.html", "Index"),
                                                  ("99_test.html", "99 · Test")])
    images = BeautifulSoup(dest.read_text(), "html.parser").find_all("img")
    assert [image.get("alt") for image in images] == [
        'Two panels: the "loss" per step & its distance',
        ""]  # a cell without alt text: an empty one, which the test above refuses
