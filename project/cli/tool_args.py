"""A tool command's own command line, made from its typed, documented function (`python -m project export ...`).

A tool (export, serve, cv, tune, prepare, ...) is a Python function; its parameters are its flags and its
docstring its `--help`. The flags it does not take itself are for `fit`'s config parser (project.cli.config).
"""

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from jsonargparse import ArgumentParser


def config_files(args: Sequence[str]) -> list[str]:
    """The values of `--config`/`-c` in a command line."""
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    return found + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def split_args(args: Sequence[str], own: set[str]) -> tuple[list[str], list[str]]:
    """(the flags named in `own` with their values, every other argument in its order) of a command line."""
    mine, forwarded, i = [], [], 0
    while i < len(args):
        arg = str(args[i])
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        target = mine if name in own else forwarded
        target.append(arg)
        if (
            name is not None
            and "=" not in arg
            and i + 1 < len(args)
            and not str(args[i + 1]).startswith("--")
        ):
            target.append(str(args[i + 1]))
            i += 1
        i += 1
    return mine, forwarded


#: The parameters through which a tool takes the flags it leaves to `fit`'s config parser.
FORWARDED = ("fit_args", "config", "overrides")


def parse_tool_args(function: Callable[..., Any], args: Sequence[str], prog: str) -> dict[str, Any]:
    """The keyword arguments of a tool `function` for its command line.

    Its own parameters (typed, documented: they make its `--help`) are parsed here; every other flag is for
    `fit`'s config parser: all of them into `fit_args` when the function takes that (the studies pass them to
    every fit), else the `--config` files into `config` and the rest into `overrides` (the tools that read a
    trained run). A bad flag of its own prints the usage and exits with status 2.
    """
    params = inspect.signature(function).parameters
    forwarded = {name for name in FORWARDED if name in params}
    own = {name for name in params if name not in forwarded} | {"help"}
    mine, rest = split_args([a if a != "-h" else "--help" for a in map(str, args)], own)
    doc = inspect.getdoc(function) or ""
    epilog = None
    if "fit_args" in forwarded:
        epilog = "Every other flag (--config, --model.*, --data.*, --trainer.*, ...) is passed to each `fit` unchanged."
    elif forwarded:
        epilog = (
            "--config (repeatable; default: the config.yaml saved beside the run's checkpoints/ folder) and every "
            "other flag (--model.*, --data.*, ...) are read by the `fit` config parser, as in `python -m project fit`."
        )
    parser = ArgumentParser(prog=prog, description=doc.split("\n\nArgs:")[0], epilog=epilog)
    parser.add_function_arguments(function, as_group=False, skip=set[str | int](forwarded))
    parsed = parser.parse_args(mine).as_dict()
    if "fit_args" in forwarded:
        parsed["fit_args"] = rest
    elif "config" in forwarded:
        parsed["config"] = config_files(rest)
        parsed["overrides"] = [a for a in rest if a not in parsed["config"] and a not in ("--config", "-c")]
        parsed["overrides"] = [a for a in parsed["overrides"] if not a.startswith("--config=")]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return parsed
