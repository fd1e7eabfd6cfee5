"""The registries of the core's seams: what each one offers, from the core's own packages and every part present.

A package says what it adds in a literal `REGISTER` table in its `__init__.py`, which is read here as text,
without importing the package: `python -m project --help` lists the commands without loading torch, and a class
is imported only when a command line, a config or a checkpoint names it. A part deleted takes its entries with
it, so the core never names a part. A table maps each seam to its entries, a command's to its module's `main` and
its summary (`{"commands": {"export": (".model_export:main", "export a checkpoint to ONNX")}}`), a task's to its
module (`{"tasks": {"MultiLabelClassifier": ".task"}}`), a kind of target's to its class (`{"target_kinds":
{"tags": ".kind:Tags"}}`).

Paths are relative to the package. A class is registered under its own name (what `class_path:` may name, so
`.task` means `.task:MultiLabelClassifier`); a kind of target under the name checkpoints record; a command under
its name, with its summary.
"""

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

#: The seams, and what each registers: commands (run by `python -m <package> NAME`), tasks (LightningModules),
#: kinds of target, DataModules, sources of image files, validation splits, networks, callbacks.
SEAMS = ("commands", "tasks", "target_kinds", "datamodules", "sources", "splits", "networks", "callbacks")
#: The seams whose entries are classes a config names by their short name.
CLASS_SEAMS = ("tasks", "datamodules", "sources", "splits", "networks", "callbacks")

PACKAGE = __name__.rpartition(".")[0]
FOLDER = Path(__file__).resolve().parent


@cache
def _tables() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(package, its `REGISTER` literal) for the top-level package and each subpackage present, by name."""
    found = [(PACKAGE, _register_literal(FOLDER / "__init__.py"))]
    for module in sorted(pkgutil.iter_modules([str(FOLDER)]), key=lambda m: m.name):
        if module.ispkg:
            found.append(
                (f"{PACKAGE}.{module.name}", _register_literal(FOLDER / module.name / "__init__.py"))
            )
    return tuple((package, table) for package, table in found if table)


def _register_literal(init_file: Path) -> dict[str, Any]:
    source = init_file.read_text(encoding="utf-8") if init_file.is_file() else ""
    if "REGISTER" not in source:
        return {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["REGISTER"]:
            table = ast.literal_eval(node.value)
            unknown = set(table) - set(SEAMS)
            if unknown:
                raise ValueError(
                    f"{init_file}: REGISTER names no seam {sorted(unknown)} (the seams: {SEAMS})"
                )
            return table
    return {}


def _present(package: str, module: str) -> bool:
    """Whether `module` (dotted, relative to `package`) is a file of this tree, found without importing it."""
    *folders, last = module.lstrip(".").split(".")
    where = FOLDER.joinpath(*package.split(".")[1:], *folders)
    return (where / f"{last}.py").is_file() or (where / last / "__init__.py").is_file()


@cache
def registered(seam: str) -> dict[str, str]:
    """What `seam` offers: name -> "module:attribute", in the order of the packages' names, the core's first
    (the top-level package's own table). An entry whose module is absent is left out."""
    if seam not in SEAMS:
        raise ValueError(f"no seam named {seam!r}; the seams: {', '.join(SEAMS)}")
    entries: dict[str, str] = {}
    for package, table in _tables():
        for name, value in table.get(seam, {}).items():
            target = value[0] if isinstance(value, tuple | list) else value
            module, _, attribute = target.partition(":")
            if _present(package, module):
                entries[name] = f"{package}{module}:{attribute or name}"
    return entries


@cache
def command_summaries() -> dict[str, str]:
    """The registered commands' one-line summaries, by name."""
    return {
        name: value[1]
        for _, table in _tables()
        for name, value in table.get("commands", {}).items()
        if name in registered("commands")
    }


def load(seam: str, name: str) -> Any:
    """The registered object `name` of `seam`, imported; KeyError naming the registered ones if none is."""
    entries = registered(seam)
    if name not in entries:
        raise KeyError(f"no {seam} entry {name!r}; registered: {', '.join(entries) or 'none'}")
    module, attribute = entries[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def load_all(seam: str) -> dict[str, Any]:
    """Every registered object of `seam`, imported: for the contract suites and the checks that list them."""
    return {name: load(seam, name) for name in registered(seam)}


def import_named(texts: Iterable[str]) -> None:
    """Import the registered classes whose name appears as a word in `texts` (a command line, config files):
    jsonargparse then resolves them by their short name (`class_path: MultiLabelClassifier`)."""
    text = "\n".join(texts)
    for seam in CLASS_SEAMS:
        for name, target in registered(seam).items():
            if re.search(rf"\b{re.escape(name)}\b", text):
                importlib.import_module(target.split(":")[0])
