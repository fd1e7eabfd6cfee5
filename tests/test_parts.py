"""Each optional part (parts.yaml) is removable by deleting its files and the lines marked as its own in the files
it shares with the core: nothing else names it in code or configs, and what remains starts, lists its commands
and collects its tests; the commands offered are those the parts present register."""

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from project import TOOLS
from tests.conftest import PACKAGE, ROOT
from tests.repo_copy import (
    PARTS,
    copy_repository,
    delete_part,
    glob_pattern,
    part_files,
    part_is_present,
    repository_files,
    run_in,
    without_part_blocks,
)


def test_every_pattern_of_a_part_present_names_files_of_the_repository():
    files = repository_files()
    present = [part for part in PARTS if part_files(part, files)]
    empty = [
        (p, glob) for p in present for glob in PARTS[p]["files"] if not any(_matches(glob, f) for f in files)
    ]
    assert len(present) == len(PARTS) and not empty, (set(PARTS) - set(present), empty)


def _matches(pattern: str, name: str) -> bool:
    return glob_pattern(pattern).fullmatch(name) is not None


def test_the_glob_patterns_match_as_parts_yaml_says():
    assert _matches("pkg/part/**", "pkg/part/api.py")
    assert _matches("pkg/part/**", "pkg/part/deep/er/x.py")
    assert not _matches("pkg/part/**", "pkg/parts.py")
    assert _matches("tests/test_*.py", "tests/test_part.py") and not _matches("tests/*.py", "tests/a/b.py")
    assert not _matches("tests/test_x.py", "tests/test_xyz") and not _matches("a.b", "axb")


def test_the_commands_offered_are_those_of_the_parts_present_and_each_runs_a_function():
    for part, spec in PARTS.items():
        offered = set(spec["commands"]) & set(TOOLS)
        assert offered == (set(spec["commands"]) if part_is_present(part) else set()), (part, list(TOOLS))
    for name, (target, _) in TOOLS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def part_references(part: str) -> re.Pattern[str]:
    """What names `part` in code and configs: its modules' dotted paths (`<package>.serve.api`), its other
    files' paths, and a launch of its commands (`-m <package> serve`)."""
    files = part_files(part, repository_files())
    modules = {
        f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for f in files
        if f.startswith(f"{PACKAGE}/") and f.endswith(".py")
    }
    names = [rf"\b{re.escape(m)}\b" for m in modules]
    names += [re.escape(f) for f in files if not f.startswith(f"{PACKAGE}/")]
    names += [rf"-m {PACKAGE} {c}\b" for c in PARTS[part]["commands"]]
    return re.compile("|".join(names))


def code_strings(path: Path, text: str) -> list[str]:
    """What a file says to the machine: a Python file's imports and string constants (docstrings and
    comments left out), a YAML file's keys and values (comments left out)."""
    if path.suffix == ".py":
        tree = ast.parse(text)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif (
                isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            ):
                found.append(node.value)
        return found
    if path.suffix in (".yaml", ".yml"):
        found, todo = [], [yaml.safe_load(text)]
        while todo:
            item = todo.pop()
            if isinstance(item, dict):
                found += [str(k) for k in item]
                todo += list(item.values())
            elif isinstance(item, list):
                todo += item
            elif isinstance(item, str):
                found.append(item)
        return found
    return []


@cache
def strings_of(name: str, part: str | None) -> list[str]:
    """`code_strings` of the repository's file `name`, without the lines marked as `part`'s (if given)."""
    text = (ROOT / name).read_text()
    return code_strings(ROOT / name, without_part_blocks(text, part) if part else text)


@pytest.mark.parametrize("part", sorted(PARTS))
def test_nothing_outside_a_part_names_it_in_code_or_configs(part):
    """Outside the part's files, and outside the lines marked as the part's, no import of its modules, no
    string or config value naming a module or a file of it, no launch of its commands."""
    references, files = part_references(part), repository_files()
    own = set(part_files(part, files))
    found = []
    for name in files:
        if name in own or name == "parts.yaml" or not name.endswith((".py", ".yaml", ".yml")):
            continue
        marked = f"part: {part}" in (ROOT / name).read_text()
        found += [
            f"{name}: {s[:120]!r}" for s in strings_of(name, part if marked else None) if references.search(s)
        ]
    assert found == [], f"outside {part}, naming it: {found}"


def test_the_check_finds_an_import_a_string_and_a_launch():
    assert code_strings(
        Path("x.py"), f'"""Uses {PACKAGE}.serve."""\nimport {PACKAGE}.serve.api\nX = "a"\n'
    ) == [
        f"{PACKAGE}.serve.api",
        "a",
    ]
    assert code_strings(Path("x.yaml"), "# a comment\nk: {class_path: v}\n") == ["k", "class_path", "v"]
    if "production" in PARTS:
        references = part_references("production")
        assert references.search(f"{PACKAGE}.serve.api") and references.search(f"x -m {PACKAGE} export y")
        assert not references.search(f"{PACKAGE}.server") and not references.search(f"-m {PACKAGE} exports")


def command_file(command: str) -> str:
    """The file of the function a tool command runs, relative to the repository root."""
    module = TOOLS[command][0].split(":")[0]
    return module.replace(".", "/") + ".py"


@pytest.mark.slow
@pytest.mark.parametrize("part", sorted(PARTS))
def test_deleting_a_part_leaves_a_project_that_starts_and_collects_its_tests(part, tmp_path):
    copy = copy_repository(tmp_path / "copy")
    deleted = delete_part(part, copy)
    assert deleted and not [name for name in deleted if (copy / name).exists()]
    assert not list(copy.rglob("*.py")) or not [
        p for p in copy.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".toml", ".md")
        and re.search(rf"(#|<!--) ?/?part: {part}\b", p.read_text())
    ]  # fmt: skip

    help_text = run_in(copy, "-m", PACKAGE, "--help")
    assert help_text.returncode == 0, help_text.stderr
    listed = {line.split()[0] for line in help_text.stdout.splitlines() if line.startswith("  ")}
    # Another part's command stays, unless its module is a file of this part too (parts.yaml: a file listed by
    # two parts needs both): INT8 quantization, a compression command, reports on production's exports.
    others = {c for p, spec in PARTS.items() if p != part for c in spec["commands"]}
    shared = {c for c in others if command_file(c) in deleted}
    assert not listed & set(PARTS[part]["commands"]) and others - shared <= listed, help_text.stdout
    assert not listed & shared, help_text.stdout
    for command in PARTS[part]["commands"]:
        gone = run_in(copy, "-m", PACKAGE, command)
        assert gone.returncode == 2 and gone.stderr.startswith(f"error: unknown command {command!r}")

    collected = run_in(copy, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider")
    assert collected.returncode == 0 and "error" not in collected.stdout.splitlines()[-1], (
        collected.stdout[-5000:] + collected.stderr[-3000:]
    )


def test_a_project_that_is_no_git_repository_yet_lists_the_same_files(tmp_path):
    """A project just made with `copier copy` has no .git until its owner runs `git init`: its first `make test`
    must list its files all the same (.gitignore read as git reads it)."""
    copy = copy_repository(tmp_path / "copy")
    for ignored in ("logs/runs/version_0/metrics.csv", "build/x.txt", "project_cache/__pycache__/a.pyc"):
        (copy / ignored).parent.mkdir(parents=True, exist_ok=True)
        (copy / ignored).write_text("")
    listed = run_in(
        copy, "-c", "from tests.repo_copy import repository_files; print('\\n'.join(repository_files()))"
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == repository_files()
