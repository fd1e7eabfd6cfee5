"""The run's configuration: `fit`'s parser and defaults, and the tools' command lines, in one place.

`python -m project fit` (project.cli.ProjectCLI) and every tool (export, serve, cv, tune, ...) read a config the
same way: `fit_parser` holds the template's defaults (loggers, callbacks, the task) and the links data -> model;
`parse_fit_args` reads `--config` files and flags with it and names a bad key or value in one line;
`parse_tool_args` makes a tool's command line from its typed, documented function.
"""

import importlib
import inspect
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace  # pyright: ignore[reportPrivateImportUsage]  # exported, not in __all__
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project import models
from project.callbacks import (
    BestAndLastCheckpoint,
    DataWaitMonitor,
    GradientNormMonitor,
    NonFiniteGuard,
    PredictionWriter,
    WandbDashboard,
    import_named,
)
from project.callbacks.network_summary import NetworkSummary
from project.data import ImageDataModule
from project.errors import UserError, find_user_error
from project.run.run_folder import DEFAULT_ROOT_DIR
from project.tasks import ImageClassifier, ImageTask

SEED = 42

# Loggers left at save_dir `logs` follow trainer.default_root_dir (project.run.plan).
TRAINER_DEFAULTS: dict[str, Any] = {
    "default_root_dir": DEFAULT_ROOT_DIR,
    "logger": [
        # First logger: its versioned folder (logs/runs/version_N) holds the run's config and checkpoints.
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "name": "runs"},
        },
        # Offline unless WANDB_MODE=online (or `offline: false` in a config): no account, no network needed.
        # Lightning's WandbLogger, its run started in the background (off the path to the first step).
        {
            "class_path": "project.loggers.wandb.WandbLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "project": "lightning-template", "offline": True},
        },
    ],
}
#: The task a config that names none trains.
DEFAULT_TASK = f"{ImageClassifier.__module__}.{ImageClassifier.__qualname__}"


def add_project_arguments(parser: LightningArgumentParser) -> None:
    """The always-on callbacks, each configurable under its own key, and the data -> model links."""
    parser.set_defaults({"model": {"class_path": DEFAULT_TASK}})
    # monitor None: the task's own metric (ImageTask.monitor), set by the run plan; the file name follows it.
    parser.add_lightning_class_args(BestAndLastCheckpoint, "checkpoint")
    parser.set_defaults({"checkpoint.save_last": True})
    parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
    parser.add_lightning_class_args(RichProgressBar, "progress_bar")
    parser.add_lightning_class_args(NetworkSummary, "model_summary")
    parser.set_defaults({"model_summary.max_depth": 2})
    parser.add_lightning_class_args(PredictionWriter, "prediction_writer")
    # Cheap training diagnostics and the W&B dashboard (README "Training diagnostics").
    parser.add_lightning_class_args(GradientNormMonitor, "grad_norm")
    parser.add_lightning_class_args(NonFiniteGuard, "nonfinite_guard")
    parser.add_lightning_class_args(DataWaitMonitor, "data_wait")
    parser.add_lightning_class_args(WandbDashboard, "wandb_dashboard")

    # Each link applies where its target exists: a task or network without the argument is left alone.
    parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
    parser.link_arguments("data.class_names", "model.init_args.class_names", apply_on="instantiate")
    parser.link_arguments("data.input_shape", "model.init_args.input_shape", apply_on="instantiate")
    net = "model.init_args.net.init_args"
    parser.link_arguments("data.num_classes", f"{net}.num_classes", apply_on="instantiate")
    parser.link_arguments("data.input_shape", f"{net}.input_shape", apply_on="instantiate")


def check_config_file(path: str) -> str:
    """The text of the config file `path`; a UserError naming it when it cannot be read or is not valid YAML
    (jsonargparse names neither)."""
    file = Path(path)
    if not file.exists():
        return ""  # the parser's own message names the missing file
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {file}: {getattr(e, 'strerror', None) or e}") from None
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UserError(
            f"config file {file} is not valid YAML{where}: {getattr(e, 'problem', None) or e}"
        ) from None
    if not isinstance(content, dict):
        what = "is empty" if content is None else f"holds a {type(content).__name__}"
        raise UserError(
            f"config file {file} {what}: a config is a mapping of settings (`trainer:`, `model:`, `data:`, ...)"
        )
    return text


def before_parsing(args: Sequence[str]) -> None:
    """What a command line needs before it is parsed: its config files checked, and the optional callbacks it
    names imported (the core imports none of them)."""
    args = [str(a) for a in args]
    import_named([*args, *(check_config_file(path) for path in config_files(args))])


def config_files(args: Sequence[str]) -> list[str]:
    """The values of `--config`/`-c` in a command line."""
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    return found + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


# Lines of jsonargparse's message for a class chosen by class_path (the task, the data, the network) that only
# say how it searched: the line that names the key and the one that says what is wrong are what remain.
_SEARCH_LINES = ("Does not validate against any", "Subtypes:", "Errors:", "- Expected a <class 'NoneType'>")
_SEARCH_LINES += ("Given value type:", "Given value:", "Expected a <class 'NoneType'>")
_NESTED_KEY = re.compile(
    r'Parser key "([\w.]+)": Problem with given class_path \'[^\']+\': Parser key "([\w.]+)":'
)


_UNKNOWN_NET = re.compile(r'Parser key "([\w.]*\bnet)": .*Expected a dot import path string: (\S+)')


def parse_error_line(message: str) -> str:
    """jsonargparse's (often many-line) parse error as one line naming the key and what is wrong with it."""
    lines = [line.strip().removeprefix("- ") for line in str(message).strip().splitlines()]
    text = " ".join(line for line in lines if line and not line.startswith(_SEARCH_LINES))
    # `Parser key "model": Problem with given class_path '...': Parser key "net": ...` -> `Parser key "model.net": ...`
    while (joined := _NESTED_KEY.sub(r'Parser key "\1.\2":', text)) != text:
        text = joined
    if unknown := _UNKNOWN_NET.search(text):
        nets = [name for name in models.__all__ if isinstance(getattr(models, name), type)]
        return (
            f'Parser key "{unknown[1]}": {unknown[2]} is not a network: one of {", ".join(nets)} '
            "(project.models), or the import path of any nn.Module (e.g. torchvision.models.resnet18)"
        )
    return text or str(message).strip()


def task_class(class_path: str) -> type | None:
    """The class a config's `class_path` names (the parser has checked it), or None."""
    module, _, name = str(class_path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def fit_parser() -> LightningArgumentParser:
    """The parser of `python -m project fit`, built without running anything: for the tool commands, which read
    a run's config files (or its saved config.yaml) and instantiate only the pieces they need."""
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_argument("--seed_everything", type=bool | int, default=SEED)
    parser.add_lightning_class_args(Trainer, "trainer")
    parser.set_defaults({f"trainer.{key}": value for key, value in TRAINER_DEFAULTS.items()})
    parser.add_lightning_class_args(ImageTask, "model", subclass_mode=True)
    parser.add_lightning_class_args(ImageDataModule, "data", subclass_mode=True)
    add_project_arguments(parser)
    parser.add_method_arguments(Trainer, "fit", skip=set(LightningCLI.subcommands()["fit"]))
    return parser


def parse_fit_args(args: Sequence[str]) -> tuple[LightningArgumentParser, Namespace]:
    """(the `fit` parser, the config) of `fit`'s command-line arguments (`--config` files, later ones winning,
    and `--KEY VALUE` flags), instantiating nothing; a bad file, key or value is a UserError naming it."""
    before_parsing(args)
    parser = fit_parser()
    try:
        return parser, parser.parse_args([str(a) for a in args])
    except Exception as e:  # jsonargparse's ArgumentError (exit_on_error=False): name the key and value
        raise UserError(parse_error_line(str(e))) from None


def instantiate_section(key: str, base: type, config: Namespace) -> Any:
    """Instantiate one class-path section of a parsed config (`data`, a task's `net`) and nothing else; what its
    `__init__` refuses is the UserError it raised."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(base, key, required=True)
    try:
        return getattr(parser.instantiate(parser.parse_object({key: config.clone()})), key)
    except Exception as e:  # jsonargparse wraps errors raised in a class's __init__
        raise (find_user_error(e) or e) from None


def build_datamodule(config: Namespace) -> ImageDataModule:
    """The DataModule of a parsed `fit` config, alone: its own checks (folders, splits, folds) run now."""
    return instantiate_section("data", ImageDataModule, config.data)


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
