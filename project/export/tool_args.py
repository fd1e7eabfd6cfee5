"""Command-line parsing shared by the tool commands (`export`, `quantize`, `serve`, `predict_onnx`).

Each tool is a typed Python function; jsonargparse documents every parameter in `--help` from the
function's signature and docstring. `--config` can be repeated as for `fit`, and `--model.*` /
`--data.*` overrides are forwarded to the `fit` config parser.
"""

import inspect
from collections.abc import Callable
from typing import Any

from jsonargparse import ArgumentParser

from project.export.trained import split_config_overrides

CONFIG_HELP = (
    "Config file(s) the model was trained with, as for `fit`; repeatable, later files win. Default: the "
    "config.yaml the training run saved beside its checkpoints/ folder."
)
OVERRIDES_EPILOG = (
    "Any --model.* or --data.* flag is passed to the `fit` config parser, as in "
    "`python -m project fit` (e.g. --data.init_args.data_dir path/to/cifar)."
)


def parse_tool_args(
    function: Callable[..., Any], args: list[str], prog: str, takes_config: bool = True
) -> dict[str, Any]:
    """Parse `args` for `function` (typed parameters with docstrings) into its keyword arguments.

    With `takes_config`, `function` takes `config: list[str]` and `overrides: list[str]` too: the
    repeated `--config` files and the forwarded `--model.*` / `--data.*` flags. A bad argument prints
    the usage and exits with status 2, like any command-line parser.
    """
    own, overrides = split_config_overrides(args) if takes_config else (list(args), [])
    doc = inspect.getdoc(function) or ""
    parser = ArgumentParser(
        prog=prog,
        description=doc.split("\n\nArgs:")[0],
        epilog=OVERRIDES_EPILOG if takes_config else None,
    )
    skip = {"config", "overrides"} if takes_config else set()
    if takes_config:
        parser.add_argument("--config", action="append", default=[], help=CONFIG_HELP)
    parser.add_function_arguments(function, as_group=False, skip=skip)
    parsed = parser.parse_args(own).as_dict()
    if takes_config:
        parsed["overrides"] = overrides
    return parsed
