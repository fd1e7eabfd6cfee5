"""The habits handed to users: `make help/clean/clean-all/lint/format/hooks`, pre-commit and the CI workflow.

Make targets run for real in temporary folders (a scratch git repository for the lint hooks), against the
running environment's tools; `-o <venv>/.installed` keeps them from ever reinstalling anything.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import yaml

from tests import docs_pages
from tests.conftest import PACKAGE, ROOT

#: The project's distribution (pyproject.toml's name: what pip installs, `<name>.egg-info`).
DISTRIBUTION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]

VENV = Path(sys.prefix)  # the environment running the tests: ruff, pre-commit and the hooks' tools
pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git"
)


def make(*args: str, cwd: Path, venv: Path = VENV) -> subprocess.CompletedProcess:
    # A clean make, as a user types it: under `make test` the inherited MAKELEVEL/MAKEFLAGS would add
    # "Entering directory" lines to the output.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    env["PRE_COMMIT_HOME"] = str(cwd / ".pre-commit-home")
    command = ["make", "-f", str(ROOT / "Makefile"), "-o", f"{venv}/.installed", f"VENV={venv}", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def git(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, **kwargs)


def test_make_help_lists_every_target_with_one_line():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z_-]*):", makefile, re.M))
    phony = set(re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split())
    out = make("help", cwd=ROOT).stdout
    listed = dict(re.findall(r"^  make (\S+) +(\S.*)$", out, re.M))
    assert set(listed) == targets == phony
    assert len(out.strip().splitlines()) == len(targets)  # one line each


def test_make_clean_keeps_data_and_checkpoints_and_clean_all_removes_logs(tmp_path):
    kept = [
        "data/cifar-10-batches-py/data_batch_1",
        "logs/runs/version_0/checkpoints/last.ckpt",
        "logs/runs/version_0/checkpoints/epoch003-val_acc0.9100.ckpt",
        "notes.txt",
    ]
    removed = [
        "logs/runs/version_0/metrics.csv",
        "logs/runs/version_0/config.yaml",
        "logs/runs/version_0/lr_find.png",
        "logs/runs/version_0/memory_snapshot_step5.pickle",
        "logs/runs/version_0/profiler/fit-profile.txt",
        "logs/.lr_find_0b1c.ckpt",
        "logs/.scale_batch_size_0b1c.ckpt",
        "logs/wandb/offline-run-1/run-1.wandb",
        "wandb/offline-run-2/run-2.wandb",
        ".pytest_cache/v/cache/lastfailed",
        ".ruff_cache/0.17/x",
        f"{PACKAGE}/__pycache__/cli.cpython-311.pyc",
        "notebooks/.ipynb_checkpoints/a-checkpoint.ipynb",
        f"build/lib/{PACKAGE}/cli.py",
        f"dist/{DISTRIBUTION}-0.1.0.tar.gz",
        f"{DISTRIBUTION}.egg-info/PKG-INFO",
    ]
    fake_venv = tmp_path / "venv"
    for name in [*kept, *removed, "venv/bin/python"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")

    assert make("clean", cwd=tmp_path, venv=fake_venv).returncode == 0
    assert [n for n in kept if not (tmp_path / n).exists()] == []
    assert [n for n in removed if (tmp_path / n).exists()] == []
    assert not (tmp_path / "logs/runs/version_0/profiler").exists() and not (tmp_path / "logs/wandb").exists()
    assert (fake_venv / "bin/python").exists()

    assert make("clean-all", cwd=tmp_path, venv=fake_venv).returncode == 0
    assert not (tmp_path / "logs").exists() and not fake_venv.exists()
    assert (tmp_path / "data/cifar-10-batches-py/data_batch_1").exists() and (tmp_path / "notes.txt").exists()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with the template's lint configuration and clean files, committed."""
    for name in [".pre-commit-config.yaml", "pyproject.toml", ".github/workflows/ci.yml"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "ok.py").write_text('"""A clean module."""\n\nVALUE = 1\n')
    (tmp_path / ".gitignore").write_text(".pre-commit-home/\n")
    git("init", "-q", cwd=tmp_path)
    git("config", "user.email", "test@example.com", cwd=tmp_path)
    git("config", "user.name", "Test", cwd=tmp_path)
    git("add", ".", cwd=tmp_path)
    git("commit", "-q", "-m", "clean", cwd=tmp_path)
    return tmp_path


NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": 3,
            "id": "a1",
            "metadata": {},
            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["42\n"]}],
            "source": ["print(42)"],
        }
    ],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def write_problems(repo: Path) -> None:
    (repo / "messy.py").write_text("import os, sys\nx = {  'a':1 }\n")  # unused imports, formatting
    (repo / "debug.py").write_text("def f():\n    breakpoint()\n")  # not fixable: must fail
    (repo / "notes.md").write_text("trailing spaces   \nno final newline")
    (repo / "broken.yaml").write_text("a: [1, 2\n")
    (repo / "run.ipynb").write_text(json.dumps(NOTEBOOK, indent=1) + "\n")
    git("add", ".", cwd=repo)


def hook_results(output: str) -> dict[str, str]:
    return {
        m[0].rstrip("."): m[1] for m in re.findall(r"^(\S.*?\.{3,})(Passed|Failed|Skipped)", output, re.M)
    }


def test_every_hook_tool_is_in_the_environment():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert {"ruff-check", "ruff-format", "nbstripout", "trailing-whitespace", "end-of-file-fixer"} <= {
        h["id"] for h in hooks
    }
    # `make install` must provide every tool a hook runs (they are dev dependencies).
    missing = [h["entry"].split()[0] for h in hooks if not (VENV / "bin" / h["entry"].split()[0]).exists()]
    assert missing == []


def test_make_lint_passes_clean_files_and_fails_and_fixes_problems(repo):
    clean = make("lint", cwd=repo)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert (
        hook_results(clean.stdout)["GitHub workflows match GitHub's schema (vendored, offline)"] == "Passed"
    )

    write_problems(repo)
    proc = make("lint", cwd=repo)
    assert proc.returncode != 0
    results = hook_results(proc.stdout)
    failed = {name for name, result in results.items() if result == "Failed"}
    assert {
        "ruff check (lint, fix what it can)",
        "ruff format",
        "nbstripout (notebook outputs)",
        "trailing whitespace",
        "one newline at end of file",
        "YAML parses (configs, workflows)",
        "no breakpoint() / pdb left in",
    } <= failed
    # What can be fixed was fixed in place; what cannot is left for the author.
    assert (repo / "messy.py").read_text() == 'x = {"a": 1}\n'
    assert (repo / "notes.md").read_text() == "trailing spaces\nno final newline\n"
    cell = json.loads((repo / "run.ipynb").read_text())["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None and cell["id"] == "a1"
    assert "breakpoint()" in (repo / "debug.py").read_text()


def test_make_format_fixes_code_and_notebooks(repo):
    write_problems(repo)
    assert make("format", cwd=repo).returncode == 0
    assert (repo / "messy.py").read_text() == 'x = {"a": 1}\n'
    assert json.loads((repo / "run.ipynb").read_text())["cells"][0]["outputs"] == []


def test_make_hooks_checks_every_commit(repo):
    assert make("hooks", cwd=repo).returncode == 0
    assert "pre-commit" in (repo / ".git/hooks/pre-commit").read_text()
    env = {
        **os.environ,
        "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}",
        "PRE_COMMIT_HOME": str(repo / ".pre-commit-home"),
    }
    (repo / "messy.py").write_text("import os, sys\nx = {  'a':1 }\n")
    git("add", "messy.py", cwd=repo)
    refused = git("commit", "-m", "messy", cwd=repo, env=env)
    assert refused.returncode != 0
    assert hook_results(refused.stdout + refused.stderr)["ruff check (lint, fix what it can)"] == "Failed"
    assert (repo / "messy.py").read_text() == 'x = {"a": 1}\n'  # fixed: stage it and commit again
    git("add", "messy.py", cwd=repo)
    assert git("commit", "-m", "tidy", cwd=repo, env=env).returncode == 0


def install_dry_run(venv: Path, *args: str) -> str:
    """The install recipe's commands as make would run them (-n: print, execute nothing)."""
    command = ["make", "-n", "-B", "-f", str(ROOT / "Makefile"), f"VENV={venv}", "install", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout


def test_install_on_a_python_the_lock_does_not_cover_stops_in_one_line_before_making_anything(tmp_path):
    # An interpreter that reports CPython 3.9: the lock's hashes would fail after minutes of downloads.
    python = tmp_path / "python3.9"
    python.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        '\'import sys; sys.version_info = (3, 9, 18, "final", 0); exec(sys.argv[1])\' "$2"\n'
    )
    python.chmod(0o755)
    venv = tmp_path / "venv"
    command = ["make", "-f", str(ROOT / "Makefile"), f"VENV={venv}", f"PYTHON={python}", "install"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr
    supported = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert errors[0].startswith(
        f"error: constraints.txt pins CPython {supported} on Linux x86-64/aarch64 and "
    )
    assert "not CPython 3.9 on" in errors[0] and errors[0].endswith("(make install CONSTRAINTS=)")
    assert not venv.exists()


def test_install_can_skip_the_pins(tmp_path):
    # Pinned by default, pyproject's ranges with CONSTRAINTS= (what CI uses on Python versions other than the
    # one the pins were resolved on).
    def dry_run(*args: str) -> str:
        return install_dry_run(tmp_path / "venv", *args)

    pinned = dry_run()
    assert "pip install -q --require-hashes -r constraints.txt" in pinned
    assert "pip install -q --no-deps --no-build-isolation -e ." in pinned  # the project: nothing unhashed
    ranges = dry_run("CONSTRAINTS=")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned_extras = ",".join(e for e in extras if e != "plots")  # every extra but the unpinned one
    assert f"-e '.[{pinned_extras}]'" in ranges and "constraints.txt" not in ranges
    assert "--require-hashes" not in ranges  # the ranges resolve anew: there is nothing to check them against


def test_the_pinned_pip_is_installed_first_and_alone(tmp_path):
    # The pip a new venv bundles (23.2) refuses a dependency's extra (litserve's uvicorn[standard]) in
    # --require-hashes mode as soon as the index has a newer release than the pin: pip goes in first.
    venv = tmp_path / "venv"
    commands = install_dry_run(venv).splitlines()
    pip_first = commands.index(f"{venv}/bin/python -m pip install -q --require-hashes -r {venv}/pip-pin.txt")
    assert pip_first < commands.index(
        f"{venv}/bin/python -m pip install -q --require-hashes -r constraints.txt"
    )
    venv.mkdir()
    extract = next(c for c in commands if c.endswith(f"> {venv}/pip-pin.txt"))
    subprocess.run(["bash", "-c", extract], cwd=ROOT, check=True, timeout=60)
    pin = (venv / "pip-pin.txt").read_text().splitlines()
    version = next(
        line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("pip==")
    )
    assert pin[0] == version and len(pin) >= 2
    assert all(line.strip().startswith("--hash=sha256:") for line in pin[1:])


def test_every_extra_the_readme_installs_is_declared():
    # `pip install -e '.[plots]'` and the like, on any page: pip only warns about an extra that does not exist.
    named = re.findall(r"pip install -e ['\"]\.\[([a-z,-]+)\]['\"]", docs_pages.text())
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    expected = {"plots"}
    # part: streaming
    expected.add("streaming")
    # /part: streaming
    # part: studies
    expected.add("postgres")
    # /part: studies
    assert expected <= {e for n in named for e in n.split(",")} <= set(extras)


def test_ci_workflow_runs_the_readme_test_command_on_every_supported_python():
    from tests.test_lock import supported_pythons

    workflow = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert {"push", "pull_request"} <= set(triggers)
    test = workflow["jobs"]["test"]
    assert test["strategy"]["matrix"]["python"] == supported_pythons()
    setup = next(s for s in test["steps"] if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "${{ matrix.python }}" and setup["with"]["cache"] == "pip"
    assert "constraints.txt" in setup["with"]["cache-dependency-path"]
    readme_test = re.search(r"^(make test-all)\b", docs_pages.text(), re.M).group(1)  # docs/development.md
    runs = [s["run"] for s in test["steps"] if "run" in s]
    assert any(run.startswith(readme_test + " ") and "CONSTRAINTS" not in run for run in runs)  # the pins
    assert any(s.get("run", "").startswith("make lint") for s in workflow["jobs"]["lint"]["steps"])


def _pins() -> dict[str, str]:
    """constraints.txt's pins for this interpreter and platform (the lock's markers evaluated here)."""
    from packaging.markers import default_environment

    from tests.test_lock import pins_for

    return {name: version for name, (version, _) in pins_for(dict(default_environment())).items()}


def test_every_pin_has_a_sha256():
    """pip's --require-hashes refuses the whole install if one requirement lacks a hash: each pin is exact and
    carries the sha256 of at least one file."""
    from tests.test_lock import lock

    bad = [
        str(r) for r, hashes in lock() if not hashes or len(r.specifier) != 1 or "==" not in str(r.specifier)
    ]
    assert bad == []
    assert {"torch", "torchvision", "lightning", "pyright"} <= set(_pins())


@pytest.mark.parametrize("name", ["lightning", "pytorch-lightning"])
def test_the_malicious_lightning_releases_are_excluded(name):
    """lightning and pytorch-lightning 2.6.2 and 2.6.3 on PyPI carried credential-stealing code: no range in
    pyproject.toml may resolve to them, and the pins are not them either."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for ds in project["optional-dependencies"].values() for d in ds]
    declared = [Requirement(d) for d in [*project["dependencies"], *extras]]
    ranges = [r.specifier for r in declared if _normalise(r.name) == name]
    assert ranges, f"{name} must be declared (lightning requires pytorch-lightning without a range)"
    pinned = _pins()[name]
    for specifier in ranges:
        assert not specifier.contains("2.6.2") and not specifier.contains("2.6.3")
        assert specifier.contains(pinned)  # the pinned release still fits
    assert pinned not in ("2.6.2", "2.6.3")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_constraints_pin_exactly_what_is_installed():
    """constraints.txt is `pip freeze` of `make install`: nothing pinned for this Python and platform that is
    not installed, nothing installed that is not pinned."""
    # Only what pip installed into the environment: once imported, setuptools puts its vendored packages
    # (jaraco.*, an older packaging, ...) on sys.path, and metadata.distributions() would list them too.
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {_normalise(d.metadata["Name"]): d.version for d in metadata.distributions(path=site)}
    # pip, setuptools and wheel are pinned too (the installer and the project's build backend), but an
    # environment may carry other versions of them (a developer's upgraded pip).
    tools = ("pip", "setuptools", "wheel")
    installed = {k: v for k, v in installed.items() if k not in (*tools, _normalise(DISTRIBUTION))}
    assert installed == {k: v for k, v in _pins().items() if k not in tools}


def test_every_imported_package_is_declared():
    """What the code imports is a runtime dependency; what only tests and benchmarks import, a dev one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_normalise(re.split(r"[<>=\[ ;]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    dev = {
        _normalise(re.split(r"[<>=\[ ;]", d, maxsplit=1)[0]) for d in project["optional-dependencies"]["dev"]
    }
    distributions = metadata.packages_distributions()

    def imported(*folders: str) -> set[str]:
        names = set()
        for folder in folders:
            for path in (ROOT / folder).rglob("*.py"):
                for node in ast.walk(ast.parse(path.read_text())):
                    if isinstance(node, ast.Import):
                        names |= {alias.name.split(".")[0] for alias in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names.add(node.module.split(".")[0])
        found = set()
        for name in names - set(sys.stdlib_module_names) - {PACKAGE, "tests", "benchmarks", "examples"}:
            if name not in distributions and _normalise(name) in extras:
                found.add(_normalise(name))  # an extra that is not installed (`plots`: matplotlib)
                continue
            assert name in distributions, f"{name} is imported but installed by no distribution"
            found |= {_normalise(d) for d in distributions[name]}
        return found

    # An optional feature's own package may come with its extra (`streaming`: litdata), imported only there.
    extras = {
        _normalise(re.split(r"[<>=\[ ;]", d, maxsplit=1)[0])
        for name, deps in project["optional-dependencies"].items()
        if name != "dev"
        for d in deps
    }
    assert imported(PACKAGE) <= runtime | extras, imported(PACKAGE) - runtime - extras
    tested = imported("tests", "benchmarks")
    assert tested <= runtime | dev | extras, tested - runtime - dev - extras
