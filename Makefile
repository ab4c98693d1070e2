# The two commands a newcomer runs: `make study` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROFILE ?= small
# The peers environment: the peer libraries the peers study compares (pyproject's `peers`
# extra), kept apart because their pins conflict with the main environment's.
PEERS_VENV := .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
PEERS_STAMP := $(PEERS_VENV)/.installed
FFCV_APT := libopencv-dev libturbojpeg0-dev pkg-config
# spdl.io (SPDL's decoder) loads FFmpeg's shared libraries (Debian 12: FFmpeg 5.1).
SPDL_APT := libavcodec59 libavformat59 libavfilter8 libavdevice59 libavutil57 libswscale6 \
	libswresample4

.PHONY: setup peers study quick test test-fast test-durations lint docs clean-data gpu-study gpu-wheels \
	notebook-screenshot

# The C extensions (lib/storebench/*.c), built into the checkout by `pip install -e`. The
# crop-window JPEG decoder compiles against libjpeg-turbo's headers, installed with apt when
# we are root and they are missing; without them it is left out (decode="window" says so).
JPEG_APT := libjpeg62-turbo-dev
EXTENSIONS := $(wildcard lib/storebench/*.c lib/storebench/*.h)
$(STAMP): pyproject.toml $(EXTENSIONS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ ! -e /usr/include/jpeglib.h ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; \
	then \
	  echo "make: installing libjpeg-turbo's headers with apt: $(JPEG_APT)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(JPEG_APT)) >/dev/null || echo "make: apt-get failed" >&2; \
	fi
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev,ray]'
	touch $(STAMP)

# FFCV compiles against OpenCV and libjpeg-turbo: installed with apt when we are root and
# they are missing. Without them FFCV is not installed, and its rows and tests say why
# (`storebench.environments`); everything else still works.
$(PEERS_STAMP): pyproject.toml $(EXTENSIONS)
	test -x $(PEERS_BIN)/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev,peers]'
	@if ! pkg-config --exists opencv4 libturbojpeg 2>/dev/null && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null; then \
	  echo "make: installing FFCV's build dependencies with apt: $(FFCV_APT)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(FFCV_APT)) >/dev/null || echo "make: apt-get failed" >&2; \
	fi
	@if pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then \
	  $(PEERS_BIN)/python -m pip install --disable-pip-version-check -q -e '.[ffcv]'; \
	else \
	  echo "make: FFCV left out: it needs $(FFCV_APT) (apt, as root)" >&2; \
	fi
	@if ! ldconfig -p | grep -q 'libavdevice\.so' && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null; then \
	  echo "make: installing spdl.io's FFmpeg libraries with apt: $(SPDL_APT)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(SPDL_APT)) >/dev/null || echo "make: apt-get failed" >&2; \
	fi
	touch $(PEERS_STAMP)

setup: $(STAMP)

peers: $(PEERS_STAMP)

# Build every format, run every study, regenerate the figures and execute the notebooks.
study: $(STAMP) $(PEERS_STAMP)
	$(BIN)/storebench study --profile $(PROFILE)

# The README's answer table measured on this machine: only the cases the committed
# reference's answer rests on (each decision's two best candidates), into results/quick/.
quick: $(STAMP) $(PEERS_STAMP)
	$(BIN)/storebench study --quick

# The slowest tests, reported after each run so that their cost is seen.
DURATIONS ?= --durations=25
# STOREBENCH_REPEAT_RULE=minimum (or maximum) runs the suite with every adaptive repeat
# rule forced to that end (docs/contributing.md): a test that passes only at the repeat
# counts this machine's noise gives then fails on any machine.
#
# ruff, the layers contract (import-linter, pyproject's [tool.importlinter]), one figure per
# measurement across the reference's studies (storebench consistency), the docs site
# built --strict into a temporary directory (a broken link or an unresolved API reference
# fails), then the whole suite (which also executes every notebook on the ci profile and
# regenerates every figure from results/reference), then the tests marked `peers` again in the
# peers environment, where the peer libraries are. pytest's "no tests collected" (5) fails.
test: $(STAMP) $(PEERS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/storebench consistency results/reference
	site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet \
	  --site-dir $$site; \
	rc=$$?; rm -rf $$site; test $$rc -eq 0
	$(BIN)/python -m pytest $(DURATIONS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	test $$rc -eq 0 || exit $$rc; \
	$(PEERS_BIN)/python -m pytest -m peers $(DURATIONS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no peers tests collected" >&2; exit 1; fi; \
	exit $$rc

# The tier to run before every commit: ruff, the layers contract, and the main
# environment's tests not marked `slow` (tests/conftest.py: those that run a whole product
# command, and those tests/slow_tests.txt lists); the peers environment is not needed.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -m "not slow" $(DURATIONS)

# Measure every main-environment test again and rewrite tests/slow_tests.txt from it.
test-durations: $(STAMP)
	$(BIN)/python -m pytest --write-slow-tests $(DURATIONS)

# Serve the docs site (mkdocs.yml, docs/) at http://127.0.0.1:8000, rebuilt on every edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Open JupyterLab headless on 127.0.0.1, load one executed notebook and save a screenshot
# outside the repository (SCREENSHOT, default under /tmp): it renders with its figures.
# Without Playwright's Chromium or the system's, it says so and skips.
SCREENSHOT ?= /tmp/storebench-notebook-screenshot.png
notebook-screenshot: $(STAMP)
	$(BIN)/python tests/notebook_screenshot.py --out $(SCREENSHOT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean-data:
	rm -rf data

# The gpu_decode study on a GPU machine borrowed for minutes, from a plain checkout: no venv,
# the machine's own python3 (with its CUDA torch). It builds storebench's C gather for that
# Python where it is missing, installs what the machine lacks (from the wheel files in
# GPU_WHEELS where that directory exists: `make gpu-wheels` fetches them on a machine with
# an index), builds only the study's set and writes $(GPU_RUNS)/<run id>/. Without a GPU the
# device cases are skipped rows saying why, and it still exits 0.
GPU_RUNS ?= results/gpu-runs
GPU_DATA ?= /tmp/storebench-gpu-data
GPU_WHEELS ?= .whl
GPU_PROFILE ?= small
# Fixed repeats: the default plan's adaptive ones (up to 9) could outlast a short lease.
GPU_REPEATS ?= 3
GPU_PYTHONPATH = lib:.$(if $(PYTHONPATH),:$(PYTHONPATH))
ROWS_SO = lib/storebench/_rows$$($(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")

gpu-study:
	@test -f $(ROWS_SO) || cc -O3 -shared -fPIC \
	  -I"$$($(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])")" \
	  lib/storebench/_rows.c -o $(ROWS_SO)
	PYTHONPATH=$(GPU_PYTHONPATH) $(PYTHON) -m storebench.gpu_study \
	  --runs $(GPU_RUNS) --data $(GPU_DATA) --profile $(GPU_PROFILE) --repeats $(GPU_REPEATS) \
	  $$(test -d $(GPU_WHEELS) && echo --wheels $(GPU_WHEELS))

# The wheels gpu-study installs on a machine that reaches no index (Python 3.12, CUDA 13,
# x86-64), fetched here into GPU_WHEELS. DALI (about 1 GB) is left out: where it is not
# installed, its cases are skipped rows saying so.
GPU_WHEEL_PINS = simplejpeg==1.9.0 lmdb==3.0.0 crc32c==2.9.post0 \
  nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.2.3.58
gpu-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $(GPU_WHEELS) \
	  $(GPU_WHEEL_PINS)
