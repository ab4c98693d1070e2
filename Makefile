# The two commands a newcomer runs: `make study` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROFILE ?= small

.PHONY: setup study test lint clean-data

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Build every format, run every study, regenerate the figures and execute the notebooks.
study: $(STAMP)
	$(BIN)/storebench study --profile $(PROFILE)

# ruff, then the whole suite (which also executes every notebook on the ci profile and
# regenerates every figure from results/reference). pytest's "no tests collected" (5) fails.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check .

clean-data:
	rm -rf data
