# The two commands of the README: `make demo` (the main job) and `make test` (the suite).
# Both create .venv on first use and install the package with every extra this machine can use.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,triton,tilecpp,cutlass,bench
PY := $(VENV)/bin/python

.PHONY: demo test info bench table lint

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m tilegym demo

test: $(VENV)/.installed
	$(PY) -m pytest

info: $(VENV)/.installed
	$(PY) -m tilegym info

bench: $(VENV)/.installed
	$(PY) -m tilegym bench

# After re-running any suite: rebuild the dispatch tables from the reports they list (tests check it).
table: $(VENV)/.installed
	$(PY) -m tilegym selection-table --refresh

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
