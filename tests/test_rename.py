"""Renaming the package is a folder rename plus its import paths: a copy renamed to `myclf` starts, trains,
passes the tests that check names, and its studies launch `myclf`, with no other string changed."""

import re
from pathlib import Path

import pytest

from tests.conftest import PACKAGE, ROOT
from tests.fakes import make_image_folder
from tests.folder_fits import tiny_fit_args
from tests.repo_copy import copy_repository, run_in

#: The new name (another one where the package is called that already).
NEW = "myclf" if PACKAGE != "myclf" else "yourclf"

#: tests/test_tooling.py's tests that name the package: build outputs `make clean` removes, the installed
#: distributions, the declared imports.
TOOLING_CHECKS = [
    "make_clean_keeps_data_and_checkpoints_and_clean_all_removes_logs",
    "constraints_pin_exactly_what_is_installed",
    "every_imported_package_is_declared",
]

#: Import paths only: `import project`, `from project`, `project.<name>` (not `[project.optional-dependencies]`,
#: not `-m project`, not "project" alone: what a careful search-and-replace would not dare change).
IMPORT_PATHS = re.compile(rf"\b(import|from) {PACKAGE}\b|(?<![\w\[./-]){PACKAGE}\.(?=[A-Za-z_])")


def rename_package(copy: Path, new: str) -> list[str]:
    """Renames the package folder in `copy` to `new` and rewrites the import paths in its Python, YAML, JSON
    and notebook files (pyproject.toml's tables are left alone); returns the files rewritten."""
    (copy / PACKAGE).rename(copy / new)
    rewritten = []
    for path in sorted(copy.rglob("*")):
        if path.suffix not in (".py", ".yaml", ".yml", ".json", ".ipynb") or not path.is_file():
            continue
        text = path.read_text()
        renamed = IMPORT_PATHS.sub(lambda m: f"{m[1]} {new}" if m[1] else f"{new}.", text)
        if renamed != text:
            path.write_text(renamed)
            rewritten.append(str(path.relative_to(copy)))
    return rewritten


def test_the_rename_rewrites_import_paths_and_nothing_else(tmp_path):
    copy = tmp_path / "copy"
    (copy / PACKAGE).mkdir(parents=True)
    source = f"import {PACKAGE}\nfrom {PACKAGE}.cli import main\nx = '{PACKAGE}.models.MLP'\n"
    source += (
        f"TABLE = '[{PACKAGE}.optional-dependencies]'\nCOMMAND = ['-m', '{PACKAGE}']\nsub{PACKAGE}.a = 1\n"
    )
    (copy / PACKAGE / "a.py").write_text(source)
    assert rename_package(copy, NEW) == [f"{NEW}/a.py"]
    assert (copy / NEW / "a.py").read_text().splitlines() == [
        f"import {NEW}",
        f"from {NEW}.cli import main",
        f"x = '{NEW}.models.MLP'",
        f"TABLE = '[{PACKAGE}.optional-dependencies]'",
        f"COMMAND = ['-m', '{PACKAGE}']",
        f"sub{PACKAGE}.a = 1",
    ]


def shadow_of_the_old_package(folder: Path) -> Path:
    """A folder to put first on the path, whose `PACKAGE` stops any import of the old name (the environment may
    have the template installed): a string the rename missed fails instead of running the original."""
    (folder / PACKAGE).mkdir(parents=True)
    message = f"the renamed copy imported the old package name {PACKAGE!r}"
    (folder / PACKAGE / "__init__.py").write_text(f"raise ImportError({message!r})\n")
    return folder


@pytest.mark.slow
def test_a_copy_renamed_by_its_import_paths_works_under_the_new_name(tmp_path):
    copy = copy_repository(tmp_path / "copy")
    assert rename_package(copy, NEW)
    shadow = shadow_of_the_old_package(tmp_path / "shadow")

    help_text = run_in(copy, "-m", NEW, "--help", shadow=shadow)
    assert help_text.returncode == 0 and help_text.stdout.startswith(f"usage: python -m {NEW} "), help_text
    assert all(f"  {tool} " in help_text.stdout for tool in ("cv", "tune", "serve", "export")), (
        help_text.stdout
    )

    images = make_image_folder(tmp_path / "images", classes=3, per_class=6, extras=False)
    args = [a.replace(str(ROOT), str(copy)) for a in tiny_fit_args(images, tmp_path)]
    fit = run_in(
        copy, "-m", NEW, "fit", *args, "--trainer.max_steps", "1", "--trainer.logger", "false", shadow=shadow
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    config = next((tmp_path / "logs").rglob("config.yaml")).read_text()
    assert f"class_path: {NEW}.models.SimpleCNN" in config and f"{PACKAGE}." not in config

    # cv and tune start each fit as `python -m <package> fit ...`
    probe = f"from pathlib import Path; from {NEW}.studies.runner import fit_command; "
    probe += "print(' '.join(fit_command(['--x', '1'], Path('r'), resume=True)[1:4]))"
    command = run_in(copy, "-c", probe, shadow=shadow)
    assert command.stdout.strip() == f"-m {NEW} fit", command.stderr

    # The tests that check the package's names, run in the copy: its import graph and what a fit imports, the
    # top-level help, `make clean`'s build outputs, the declared imports.
    checks = ["tests/test_architecture.py"]
    checks += ["tests/test_cli.py::test_top_level_help_is_answered_without_lightning_and_lists_every_command"]
    checks += [
        "tests/test_parts.py::test_the_commands_offered_are_those_of_the_parts_present_and_each_runs_a_function"
    ]
    checks += [f"tests/test_tooling.py::test_{name}" for name in TOOLING_CHECKS]
    tests = run_in(copy, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *checks, shadow=shadow)
    architecture = (copy / "tests/test_architecture.py").read_text().count("\ndef test_")
    ran = sum(int(n) for n in re.findall(r"(\d+) (?:passed|skipped)", tests.stdout.splitlines()[-1]))
    assert tests.returncode == 0 and ran == len(checks) - 1 + architecture, tests.stdout[-5000:]
