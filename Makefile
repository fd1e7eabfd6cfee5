# Every target lists itself in `make help`. `train` and `test` set up .venv first when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CONFIG ?= configs/cifar10.yaml
ARGS ?=
# The pinned versions (constraints.txt) are the tested ones; `make install CONSTRAINTS=` installs from the
# version ranges in pyproject.toml instead (what CI does on the Python versions the pins were not made on).
CONSTRAINTS ?= constraints.txt
# The lint hooks run the environment's tools (see .pre-commit-config.yaml).
WITH_VENV := PATH="$(abspath $(VENV))/bin:$$PATH"

.DEFAULT_GOAL := help
.PHONY: help install constraints train test test-all lint format hooks clean clean-all

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[dev]'
	touch $@

install: $(VENV)/.installed ## Create .venv and install the project with the pinned versions (constraints.txt)

constraints: ## Re-pin constraints.txt from a fresh venv, after changing dependencies in pyproject.toml
	rm -rf build/constraints-venv && $(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/python -m pip install -q --upgrade pip
	build/constraints-venv/bin/python -m pip install -q -c constraints.txt -e '.[dev]'
	{ grep '^#' constraints.txt; build/constraints-venv/bin/python -m pip freeze --exclude-editable; } > build/constraints.txt
	mv build/constraints.txt constraints.txt && rm -rf build/constraints-venv

train: install ## Train: python -m project fit --config $(CONFIG) $(ARGS)
	$(PY) -m project fit --config $(CONFIG) $(ARGS)

# Both run on every core (pytest-xdist): two processes on a 2-core laptop; worksteal hands a finished
# worker the queued tests of a busy one, so the long end-to-end runs do not leave a core idle at the end.
test: install ## After every change: every module, without the slow end-to-end runs (under 5 min, 2 cores)
	$(PY) -m pytest -n auto --dist worksteal -m "not slow"

test-all: install ## Everything, the end-to-end runs included: what CI runs (under 8 min, 2 cores)
	$(PY) -m pytest -n auto --dist worksteal

lint: install ## The pre-commit checks on every file: ruff, nbstripout, hygiene (fails if any fixed something)
	$(WITH_VENV) $(PY) -m pre_commit run --all-files --show-diff-on-failure

format: install ## Fix what can be fixed: ruff fixes and formatting, notebook outputs stripped
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .
	git ls-files -z '*.ipynb' | xargs -0 -r $(VENV)/bin/nbstripout --keep-id

hooks: install ## Run the lint checks on every `git commit` (pre-commit install)
	$(PY) -m pre_commit install

# In logs/: metrics, configs, W&B runs, profiler traces, memory snapshots and plots go, and so do the temporary
# checkpoints an interrupted LR or batch-size finder leaves behind; your checkpoints (*.ckpt) stay.
clean: ## Remove caches, build outputs and logs; keeps data/ and checkpoints (*.ckpt)
	rm -rf .pytest_cache .ruff_cache build dist *.egg-info wandb
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -exec rm -rf {} +
	for d in logs lightning_logs; do \
		[ -d $$d ] || continue; \
		find $$d -type f \( ! -name '*.ckpt' -o -name '.lr_find_*.ckpt' -o -name '.scale_batch_size_*.ckpt' \) -delete; \
		find $$d -depth -mindepth 1 -type d -empty -delete; \
	done

clean-all: clean ## Also remove logs/ with its checkpoints and W&B runs, and .venv; never data/
	rm -rf logs lightning_logs $(VENV)
