# Two commands: `make demo` (train the default recipe) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
# Offline copies of the datasets, when this checkout sits beside them (tests and CI).
DATA_DIR := $(abspath ../shared/data)
export JAXTRAIN_DATA_DIR ?= $(if $(wildcard $(DATA_DIR)),$(DATA_DIR))

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/jaxtrain train mlp-regression

# Both cores: one pytest worker per test file (module fixtures are built once), about 1.5x faster.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile tests

bench: $(STAMP)
	$(VENV)/bin/jaxtrain bench overhead

clean:
	rm -rf $(VENV) runs .pytest_cache
