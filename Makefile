# ddp-course: `make course` runs the course, `make test` runs the tests.
# Both create the virtual environment (.venv) on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORLD_SIZE ?= 2

.PHONY: course test lab bench student grade images venv chromium cluster clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-test.txt
	touch $@

venv: $(VENV)/.installed

# tests/test_site.py checks the rendered pages in this Chromium (Playwright never downloads
# one). When it is missing and we are root (CI), install Debian's package (about a minute);
# otherwise the test fails and says what to install.
CHROMIUM ?= /usr/bin/chromium
export CHROMIUM

chromium:
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium for tests/test_site.py: apt-get install chromium"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends chromium; \
	fi

# Lesson 12 builds two hosts and a Slurm cluster on this machine (tools/cluster.py) and needs
# Debian's Slurm and iproute2 (tools/cluster-packages.txt). As root with apt-get (CI, a
# container), the missing ones are installed here; elsewhere the lesson says why it cannot run.
cluster: venv
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		$(PY) -m tools.cluster install; \
	fi

course: venv cluster  ## execute every lesson, render HTML into build/html
	$(PY) -m tools.run_course --world-size $(WORLD_SIZE)

test: $(VENV)/.installed-test chromium cluster  ## the whole test suite
	$(PY) -m pytest

lab: venv  ## JupyterLab on the lessons (--allow-root added when run as root, e.g. in a container)
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

bench: venv  ## launch cost and per-lesson seconds against the budgets
	$(PY) -m tools.bench

student: venv  ## the student version (solutions replaced by stubs) in build/student
	$(PY) -m tools.student

grade: venv  ## grade a class: CLASS=submissions/ (a folder per student); tools/grade.py
	$(PY) -m tools.grade $(CLASS) $(NOTEBOOKS) $(if $(LESSONS),--lessons $(LESSONS))

images: venv  ## redraw the diagrams in images/
	$(PY) -m tools.diagrams

clean:
	rm -rf build
