# Every target lists itself in `make help`. `train` and `test` set up .venv first when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CONFIG ?= configs/cifar10.yaml
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install train test test-fast lint format clean clean-all

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed ## Create .venv and install the project with the pinned versions (constraints.txt)

train: install ## Train: python -m project fit --config $(CONFIG) $(ARGS)
	$(PY) -m project fit --config $(CONFIG) $(ARGS)

test: install ## Run the test suite on the CPU (a few minutes)
	$(PY) -m pytest

test-fast: install ## The suite without the slow end-to-end runs
	$(PY) -m pytest -m "not slow"

lint: install ## Check lint and formatting (ruff)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install ## Fix lint and format the code (ruff)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean: ## Remove caches and build outputs (keeps data/, logs/ and checkpoints)
	rm -rf .pytest_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

clean-all: clean ## Also remove logs/ (runs, checkpoints, W&B) and .venv; never data/
	rm -rf logs $(VENV)
