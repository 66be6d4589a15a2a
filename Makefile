# Two commands: `make demo` (train the default recipe) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
RUNTIME := $(VENV)/.runtime# jaxtrain and what it needs to train (make demo)
STAMP := $(VENV)/.installed# and the test suite's extras (make test)
# Offline copies of the datasets, when this checkout sits beside them (tests and CI).
DATA_DIR := $(abspath ../shared/data)
export JAXTRAIN_DATA_DIR ?= $(if $(wildcard $(DATA_DIR)),$(DATA_DIR))

.PHONY: demo test bench clean

# An existing .venv is reused; each stamp is redone when pyproject.toml changes.
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip

# pip byte-compiles what it installs one file at a time; compileall does the same on every core (the
# same .pyc files; like pip, it leaves a file that is not valid Python here uncompiled, and says nothing).
# The dev extras are not compiled ahead: the suite writes bytecode for the few thousand of their files it
# imports (tests/conftest.py), where compiling all of them took 19 s of a fresh clone's install.
INSTALL := $(VENV)/bin/python -m pip install --quiet --no-compile
COMPILE := $(VENV)/bin/python -m compileall -qq -j 0 $(VENV)/lib

$(RUNTIME): pyproject.toml | $(VENV)/bin/python
	$(INSTALL) -e .
	$(COMPILE) || true
	touch $(RUNTIME)

$(STAMP): pyproject.toml $(RUNTIME)
	$(INSTALL) -e ".[dev]"
	touch $(STAMP)

demo: $(RUNTIME)
	$(VENV)/bin/jaxtrain train mlp-regression

# Style (ruff) and types (mypy, its cache in .mypy_cache) first: seconds, where the suite takes minutes.
# Both cores: one pytest worker per test file (module fixtures are built once), about 1.5x faster.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests examples $(wildcard benchmarks)
	$(VENV)/bin/python -m mypy
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile tests

# Benchmarks time whole processes, PyTorch's too: every file compiled first, as pip would have left them.
bench: $(STAMP)
	$(COMPILE) || true
	$(VENV)/bin/jaxtrain bench overhead

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
