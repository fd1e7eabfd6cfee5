"""A PyTorch Lightning starter template for image classification: `python -m project --help` lists its commands.

The table of commands lives here, where it costs nothing to import: `python -m project --help` prints it
without loading torch or Lightning (seconds), which only the command that runs needs. The tool commands are
found, not listed: each optional part registers its own in a `COMMANDS` table in its package's `__init__.py`,
read here as text (importing the part would import torch), so a part deleted takes its commands with it.
"""

import ast
import pkgutil
from functools import cache
from pathlib import Path

__version__ = "0.1.0"

#: This package's import name, for what must name it at run time (`python -m <package>`, the logger); a renamed
#: copy of the template changes no string.
PACKAGE = __name__

#: The commands LightningCLI parses (project.cli.commands) and what they do (the Trainer methods' own summaries).
SUBCOMMANDS = {
    "fit": "Runs the full optimization routine.",
    "validate": "Perform one evaluation epoch over the validation set.",
    "test": "Perform one evaluation epoch over the test set.",
    "predict": "Run inference on your data.",
}

#: How the commands are started.
USAGE = f"python -m {PACKAGE}"


def __getattr__(name: str) -> dict[str, tuple[str, str]]:
    """`TOOLS`: the tool commands beside the subcommands, name -> ("module:function", summary), found at first
    use. Each function takes the remaining command-line arguments (list[str]) and parses them itself."""
    if name == "TOOLS":
        return find_tools()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def find_tools() -> dict[str, tuple[str, str]]:
    """The commands the subpackages present register, in the order of the subpackages' names, then of their
    tables. A subpackage registers its commands as `COMMANDS = {name: (".module:function", summary)}` (a
    literal; the module path relative to that subpackage); a command whose module is absent is left out."""
    tools: dict[str, tuple[str, str]] = {}
    for part in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not part.ispkg:
            continue
        folder = Path(__path__[0]) / part.name
        for name, (target, summary) in _registered_commands(folder / "__init__.py").items():
            module, _, function = target.partition(":")
            if _module_exists(folder, module.removeprefix(".")):
                tools[name] = (f"{__name__}.{part.name}{module}:{function}", summary)
    return tools


def _registered_commands(init_file: Path) -> dict[str, tuple[str, str]]:
    """The `COMMANDS` literal of a package's `__init__.py`, read without importing the package."""
    source = init_file.read_text(encoding="utf-8") if init_file.is_file() else ""
    if "COMMANDS" not in source:
        return {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMMANDS"]:
            return ast.literal_eval(node.value)
    return {}


def _module_exists(folder: Path, dotted: str) -> bool:
    """Whether the module `dotted` (relative to the package in `folder`) is there, without importing it."""
    *packages, last = dotted.split(".")
    where = folder.joinpath(*packages)
    return (where / f"{last}.py").is_file() or (where / last / "__init__.py").is_file()


def print_commands() -> None:
    """The top-level help: every command with its summary."""
    print(f"usage: {USAGE} [-h] <command> [--config CONFIG] [--KEY VALUE ...]\n")
    print(f"Training and evaluation (LightningCLI; {USAGE} <command> --help lists every option):")
    for name, summary in SUBCOMMANDS.items():
        print(f"  {name:<13} {summary}")
    tools = find_tools()
    if tools:
        print(f"\nTools ({USAGE} <tool> --help):")
    for name, (_, summary) in tools.items():
        print(f"  {name:<13} {summary}")
