# ddp-course: `make course` runs the course, `make test` runs the tests.
# Both create the virtual environment (.venv) on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORLD_SIZE ?= 2

.PHONY: course test lab bench student images venv clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

venv: $(VENV)/.installed

course: venv  ## execute every lesson, render HTML into build/html
	$(PY) -m tools.run_course --world-size $(WORLD_SIZE)

test: venv  ## the whole test suite
	$(PY) -m pytest

lab: venv  ## JupyterLab on the lessons
	$(VENV)/bin/jupyter lab notebooks

bench: venv  ## launch cost and per-lesson seconds against the budgets
	$(PY) -m tools.bench

student: venv  ## the student version (solutions replaced by stubs) in build/student
	$(PY) -m tools.student

images: venv  ## redraw the diagrams in images/
	$(PY) -m tools.diagrams

clean:
	rm -rf build
