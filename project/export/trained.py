"""Rebuild a trained network from the `--config` files `fit` used and a checkpoint, for the tool commands.

Only the pieces a tool needs are instantiated: the network (and, for tools that read data, the DataModule),
never the trainer or its loggers. The config is parsed by `fit`'s own parser (`project.cli.parse_fit_config`),
so short class names, stacked `--config` files and `--model.*` / `--data.*` overrides mean the same thing here.
Weights and preprocessing facts come from the checkpoint, loaded with `weights_only=True`.

Each tool is a typed Python function; `parse_tool_args` documents every parameter in its `--help` from the
function's signature and docstring, and forwards `--model.*` / `--data.*` flags to the config parser.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace
from torch import nn

from project.data import ImageDataModule
from project.errors import UserError, find_user_error
from project.export.preprocessing import Preprocessing
from project.run.checkpoints import load_checkpoint, load_weights

#: Prefixes of command-line overrides forwarded to the `fit` config parser (e.g. --model.net.init_args.depth 34).
CONFIG_PREFIXES = ("--model.", "--data.", "--data=", "--model=", "--seed_everything")


@dataclass
class TrainedModel:
    """A network with its trained weights, in eval mode, and what its input must look like."""

    net: nn.Module
    preprocessing: Preprocessing
    config: Namespace
    ckpt_path: Path


def split_config_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Separate `--model.*` / `--data.*` overrides (and their values) from a tool's own arguments."""
    own, overrides, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(CONFIG_PREFIXES):
            overrides.append(arg)
            if "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--"):
                overrides.append(args[i + 1])
                i += 1
        else:
            own.append(arg)
        i += 1
    return own, overrides


def default_config(ckpt_path: str | Path) -> Path | None:
    """The `config.yaml` a `fit` run saved beside its checkpoints (`<run>/checkpoints/x.ckpt` -> `<run>/config.yaml`)."""
    candidate = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    return candidate if candidate.is_file() else None


def parse_config(configs: list[str], overrides: list[str] | None = None) -> Namespace:
    """Parse `--config` files (+ overrides) with the `fit` parser, instantiating nothing."""
    from project.cli import parse_fit_config  # imported here: it pulls in the whole LightningCLI stack

    for path in configs:
        if not Path(path).is_file():
            raise UserError(f"config file {path} does not exist")
    return parse_fit_config(configs, overrides)


def _instantiate(key: str, base: type, config: Namespace) -> Any:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(base, key, required=True)
    try:
        return getattr(parser.instantiate_classes(parser.parse_object({key: config})), key)
    except Exception as e:  # jsonargparse wraps errors raised in a class's __init__
        raise (find_user_error(e) or e) from None


def build_net(config: Namespace, num_classes: int) -> nn.Module:
    """Instantiate `model.net` from a parsed config with `num_classes` outputs (the CLI links it in `fit`)."""
    net_config = config.model.net.clone()
    if "num_classes" in net_config.init_args:
        net_config.init_args.num_classes = num_classes
    return _instantiate("net", nn.Module, net_config)


def build_datamodule(config: Namespace) -> ImageDataModule:
    """Instantiate only the `data` section of a parsed config."""
    return _instantiate("data", ImageDataModule, config.data.clone())


def checkpoint_preprocessing(checkpoint: dict[str, Any], datamodule_class: str, source: str) -> Preprocessing:
    """Input size (from the model's hyperparameters) and mean/std/class names (from the DataModule's state)."""
    hparams = checkpoint.get("hyper_parameters") or {}
    state = checkpoint.get(datamodule_class)
    if not isinstance(state, dict):  # a DataModule of another name: any state with the same keys
        state = next(
            (v for v in checkpoint.values() if isinstance(v, dict) and {"mean", "std"} <= v.keys()), None
        )
    if state is None or "mean" not in state:
        raise UserError(
            f"{source} holds no preprocessing state (no '{datamodule_class}' entry with mean/std): "
            "it was not written by `python -m project fit`"
        )
    class_names = state.get("class_names") or hparams.get("class_names")
    input_shape = hparams.get("input_shape")
    if not class_names or not input_shape:
        raise UserError(f"{source} lacks class_names or input_shape in its hyperparameters")
    return Preprocessing.from_dict(
        {"input_shape": input_shape, "mean": state["mean"], "std": state["std"], "class_names": class_names},
        source=source,
    )


def load_trained(
    ckpt_path: str | Path, configs: list[str] | None = None, overrides: list[str] | None = None
) -> TrainedModel:
    """The trained network (eval mode, on the CPU) and its preprocessing, from a checkpoint and its config.

    Args:
        ckpt_path: A checkpoint written by `python -m project fit`.
        configs: The `--config` files of that run; default: the `config.yaml` the run saved beside its
            `checkpoints/` folder.
        overrides: `--model.*` / `--data.*` command-line overrides, as for `fit`.
    """
    ckpt_path = Path(ckpt_path)
    checkpoint = load_checkpoint(ckpt_path)
    if not configs:
        found = default_config(ckpt_path)
        if found is None:
            raise UserError(
                f"no --config given and no config.yaml beside the run of {ckpt_path}: pass the config(s) "
                "the model was trained with, e.g. --config configs/cifar10.yaml"
            )
        configs = [str(found)]
    config = parse_config(configs, overrides)
    datamodule_class = str(config.data.class_path).rsplit(".", 1)[-1]
    preprocessing = checkpoint_preprocessing(checkpoint, datamodule_class, source=f"checkpoint {ckpt_path}")
    net = build_net(config, preprocessing.num_classes)
    weights = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    load_weights(net, weights, source=f"checkpoint {ckpt_path}")
    return TrainedModel(net=net.eval(), preprocessing=preprocessing, config=config, ckpt_path=ckpt_path)


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
