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

.PHONY: setup peers study test lint clean-data

# lib/storebench/_rows.c: the C row gather, built into the checkout by `pip install -e`.
$(STAMP): pyproject.toml lib/storebench/_rows.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

# FFCV compiles against OpenCV and libjpeg-turbo: installed with apt when we are root and
# they are missing. Without them FFCV is not installed, and its rows and tests say why
# (`storebench.environments`); everything else still works.
$(PEERS_STAMP): pyproject.toml lib/storebench/_rows.c
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
	touch $(PEERS_STAMP)

setup: $(STAMP)

peers: $(PEERS_STAMP)

# Build every format, run every study, regenerate the figures and execute the notebooks.
study: $(STAMP) $(PEERS_STAMP)
	$(BIN)/storebench study --profile $(PROFILE)

# ruff, the layers contract (import-linter, pyproject's [tool.importlinter]), then the whole suite (which also executes every notebook on the ci profile and
# regenerates every figure from results/reference), then the tests marked `peers` again in the
# peers environment, where the peer libraries are. pytest's "no tests collected" (5) fails.
test: $(STAMP) $(PEERS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	test $$rc -eq 0 || exit $$rc; \
	$(PEERS_BIN)/python -m pytest -m peers; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no peers tests collected" >&2; exit 1; fi; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean-data:
	rm -rf data
