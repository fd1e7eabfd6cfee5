"""Rebuild a trained network from the `--config` files `fit` used and a checkpoint, for the tool commands.

Only the pieces a tool needs are instantiated: the network (and, for tools that read data, the DataModule),
never the trainer or its loggers. The config is parsed by `fit`'s own parser (`project.cli.parse_fit_args`),
so short class names, stacked `--config` files and `--model.*` / `--data.*` overrides mean the same thing here.
Weights and preprocessing facts come from the checkpoint, loaded with `weights_only=True`.

Each tool is a typed Python function; `project.cli.tool_args.parse_tool_args` makes its command line from the function's
signature and docstring, and hands the `--config` files and other flags to the config parser.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from torch import nn

from project.errors import UserError
from project.export.preprocessing import Preprocessing
from project.run.checkpoints import load_checkpoint, load_weights


@dataclass
class TrainedModel:
    """A network with its trained weights, in eval mode, what its input must look like, and what its outputs
    mean (the task's own account, `ImageTask.output_spec`, recorded in the checkpoint)."""

    net: nn.Module
    preprocessing: Preprocessing
    config: Namespace
    ckpt_path: Path
    outputs: dict[str, Any] = field(default_factory=dict)


def default_config(ckpt_path: str | Path) -> Path | None:
    """The `config.yaml` a `fit` run saved beside its checkpoints (`<run>/checkpoints/x.ckpt` -> `<run>/config.yaml`)."""
    candidate = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    return candidate if candidate.is_file() else None


def parse_config(configs: list[str], overrides: list[str] | None = None) -> Namespace:
    """Parse `--config` files (+ overrides) with the `fit` parser, instantiating nothing."""
    from project.cli.config import parse_fit_args  # imported here: it pulls in the whole LightningCLI stack

    for path in configs:
        if not Path(path).is_file():
            raise UserError(f"config file {path} does not exist")
    return parse_fit_args([*(a for path in configs for a in ("--config", str(path))), *(overrides or [])])[1]


def build_net(config: Namespace, num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """Instantiate the task's network from a parsed config with what `fit` links into it from the data: the
    number of outputs and, for networks that take it, the input shape."""
    from project.cli.config import instantiate_section

    net_config = config.model.init_args.net.clone()
    # The checkpoint holds every weight: a pretrained network (TimmNet) need not load, or download, its own first.
    if "pretrained" in net_config.init_args:
        net_config.init_args.pretrained = False
    if "weights_file" in net_config.init_args:
        net_config.init_args.weights_file = None
    if "num_classes" in net_config.init_args:
        net_config.init_args.num_classes = num_classes
    if "input_shape" in net_config.init_args:
        net_config.init_args.input_shape = input_shape
    return instantiate_section("net", nn.Module, net_config)


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
    facts = {
        "input_shape": input_shape,
        "mean": state["mean"],
        "std": state["std"],
        "class_names": class_names,
    }
    facts |= {k: state[k] for k in ("source_size", "eval_crop") if k in state}
    return Preprocessing.from_dict(facts, source=source)


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
    net = build_net(config, preprocessing.num_classes, preprocessing.input_shape)
    weights = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    load_weights(net, weights, source=f"checkpoint {ckpt_path}")
    return TrainedModel(net.eval(), preprocessing, config, ckpt_path, checkpoint.get("task") or {})
