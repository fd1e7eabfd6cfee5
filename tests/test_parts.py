"""Each optional part (parts.yaml) is removable by deleting its files: what remains starts, lists its commands
and collects its tests; and the commands offered are those the parts present register."""

import importlib

import pytest

from project import TOOLS
from tests.conftest import PACKAGE
from tests.repo_copy import (
    PARTS,
    copy_repository,
    delete_part,
    glob_pattern,
    part_files,
    part_is_present,
    repository_files,
    run_in,
)


def test_every_pattern_of_a_part_present_names_files_of_the_repository():
    files = repository_files()
    present = [part for part in PARTS if part_files(part, files)]
    empty = [
        (p, glob) for p in present for glob in PARTS[p]["files"] if not any(_matches(glob, f) for f in files)
    ]
    assert present and not empty, empty


def _matches(pattern: str, name: str) -> bool:
    return glob_pattern(pattern).fullmatch(name) is not None


def test_the_glob_patterns_match_as_parts_yaml_says():
    assert _matches("project/serve/**", "project/serve/api.py")
    assert _matches("project/serve/**", "project/serve/deep/er/x.py")
    assert not _matches("project/serve/**", "project/server.py")
    assert _matches("tests/test_*.py", "tests/test_serve.py") and not _matches("tests/*.py", "tests/a/b.py")
    assert not _matches("tests/test_cv.py", "tests/test_cvxpy") and not _matches("a.b", "axb")


def test_the_commands_offered_are_those_of_the_parts_present_and_each_runs_a_function():
    for part, spec in PARTS.items():
        offered = set(spec["commands"]) & set(TOOLS)
        assert offered == (set(spec["commands"]) if part_is_present(part) else set()), (part, list(TOOLS))
    for name, (target, _) in TOOLS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


@pytest.mark.slow
@pytest.mark.parametrize("part", sorted(PARTS))
def test_deleting_a_part_leaves_a_project_that_starts_and_collects_its_tests(part, tmp_path):
    copy = copy_repository(tmp_path / "copy")
    deleted = delete_part(part, copy)
    assert deleted and not [name for name in deleted if (copy / name).exists()]

    help_text = run_in(copy, "-m", PACKAGE, "--help")
    assert help_text.returncode == 0, help_text.stderr
    listed = {line.split()[0] for line in help_text.stdout.splitlines() if line.startswith("  ")}
    others = {c for p, spec in PARTS.items() if p != part for c in spec["commands"]}
    assert not listed & set(PARTS[part]["commands"]) and others <= listed, help_text.stdout
    gone = run_in(copy, "-m", PACKAGE, PARTS[part]["commands"][0])
    assert gone.returncode == 2 and gone.stderr.startswith(
        f"error: unknown command {PARTS[part]['commands'][0]!r}"
    )

    collected = run_in(copy, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider")
    assert collected.returncode == 0 and "error" not in collected.stdout.splitlines()[-1], (
        collected.stdout[-5000:] + collected.stderr[-3000:]
    )
