# ddp-course: `make course` runs the course, `make test` runs the tests.
# Both create the virtual environment (.venv) on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORLD_SIZE ?= 2

.PHONY: course test soak lab bench student grade images gpu-check venv chromium cluster clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

# The course's own code, importable in .venv with no sys.path lines, as `pip install -e`
# would make it: a .pth file in site-packages names this checkout (for `tools`) and
# ddp_scripts/shared (the modules several lessons' scripts import: `ddp_common`, ...).
# A .venv belongs to the checkout that made it (tests/test_lessons.py checks).
$(VENV)/.paths: $(VENV)/.installed
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "ddp_course.pth").write_text("".join(p + "\n" for p in sys.argv[1:]))' "$(CURDIR)" "$(CURDIR)/ddp_scripts/shared"
	touch $@

$(VENV)/.installed-test: $(VENV)/.paths requirements-test.txt
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-test.txt
	touch $@

venv: $(VENV)/.paths

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

# Lesson 32 builds two hosts and a Slurm cluster on this machine (tools/cluster.py) and needs
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

soak: $(VENV)/.installed-test cluster  ## the course 3 times (COURSES=N), then the launch-heavy tests, with every core kept busy
	$(PY) -m tools.course_soak --courses $(or $(COURSES),3) --tests

bench: venv  ## launch cost and per-lesson seconds against the budgets
	$(PY) -m tools.bench

student: venv  ## the student version (solutions replaced by stubs) in build/student
	$(PY) -m tools.student

grade: venv  ## grade a class: CLASS=submissions/ (a folder per student); tools/grade.py
	$(PY) -m tools.grade $(CLASS) $(NOTEBOOKS) $(if $(LESSONS),--lessons $(LESSONS))

gpu-check: venv  ## on a GPU machine: every lesson's scripts on CUDA (tools/gpu_check.py)
	$(PY) -m tools.gpu_check

images: venv  ## redraw the diagrams in images/
	$(PY) -m tools.diagrams

clean:
	rm -rf build
