"""A command's config: its parser and defaults, read with LightningCLI, and the tools' command lines.

`python -m project fit|validate|test|predict` (project.cli.commands) and every tool (export, serve, cv, tune, ...)
read a config the same way: the template's defaults (loggers, the task), the default callbacks listed in
configs/callbacks/default.yaml (each under its own key), and the links data -> model. `parse` reads a command's
`--config` files and flags with LightningCLI's parser and builds nothing; `parse_fit_args` reads them for a tool
(project.cli.tool_args makes a tool's own command line); a bad file, key or value is one line naming it.
"""

import contextlib
import importlib
import json
import sys
import types
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace  # pyright: ignore[reportPrivateImportUsage]  # exported, not in __all__
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project import PACKAGE, SUBCOMMANDS, USAGE
from project.cli.config_checks import before_parsing, load_yaml, parse_error_line
from project.cli.lightning_notices import quiet_lightning_notices
from project.cli.tool_args import config_files
from project.data import ImageDataModule
from project.errors import UserError, find_user_error
from project.lightning_private import give_config_dump
from project.redaction import redact_config
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
            "class_path": f"{PACKAGE}.loggers.wandb.WandbLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "project": "lightning-template", "offline": True},
        },
    ],
}
#: The task a config that names none trains.
DEFAULT_TASK = f"{ImageClassifier.__module__}.{ImageClassifier.__qualname__}"
#: The callbacks every run has, each under its own key: a file a user reads and edits, read as the parser is built.
DEFAULT_CALLBACKS = Path(__file__).resolve().parents[2] / "configs" / "callbacks" / "default.yaml"


@cache
def default_callbacks() -> dict[str, dict[str, Any]]:
    """The default callbacks (configs/callbacks/default.yaml): key -> `{class_path, init_args}`."""
    try:
        listed = load_yaml(DEFAULT_CALLBACKS.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"cannot read the default callbacks {DEFAULT_CALLBACKS}: {e}") from None
    for key, spec in listed.items():
        if not (isinstance(spec, dict) and isinstance(spec.get("class_path"), str)):
            raise UserError(f"{DEFAULT_CALLBACKS}: {key} names no callback (`{key}: {{class_path: ...}}`)")
    return listed


def add_project_arguments(parser: LightningArgumentParser, command: str | None) -> list[str]:
    """The template's own settings: the default callbacks, each under its own key (null: a run without it), the
    Trainer method's arguments of `command` (`ckpt_path`, ...), whether `fit` tests its best checkpoint, and
    the data -> model links. Returns the names of the method's arguments."""
    parser.set_defaults({"model": {"class_path": DEFAULT_TASK}})
    for key, spec in default_callbacks().items():
        parser.add_argument(
            f"--{key}",
            type=Callback | None,  # pyright: ignore[reportArgumentType]
            help=f"A default callback ({DEFAULT_CALLBACKS.parent.name}/{DEFAULT_CALLBACKS.name}); null: none",
        )
        parser.set_defaults({key: spec})
    method_args = []
    if command is not None:
        skip = set[str | int](LightningCLI.subcommands()[command])
        method_args = parser.add_method_arguments(Trainer, command, skip=skip)
    # Every command takes it, for a fit's saved config.yaml holds it and validate/test/predict read that file;
    # only fit acts on it.
    parser.add_argument(
        "--test_after_fit",
        type=bool,
        default=True,
        help="fit: test the best checkpoint on the data's test split after fitting, where it has one",
    )

    # Each link applies where its target exists: a task or network without the argument is left alone.
    for source, target in LINKS:
        parser.link_arguments(f"data.{source}", target, apply_on="instantiate")
    return method_args


#: What `fit` links from the DataModule into the task and its network: (data attribute, config key).
LINKS = (
    ("num_classes", "model.init_args.num_classes"),
    ("class_names", "model.init_args.class_names"),
    ("input_shape", "model.init_args.input_shape"),
    ("num_classes", "model.init_args.net.init_args.num_classes"),
    ("input_shape", "model.init_args.net.init_args.input_shape"),
)


def with_room_for_links(dumped: dict[str, Any]) -> dict[str, Any]:
    """The dumped config with an empty `init_args` in each class a link targets that has none (a network whose only
    settings are linked has none), where LightningCLI's instantiators write the linked values."""
    for _, target in LINKS:
        node = dumped
        for key in target.split(".")[:-1]:
            if key == "init_args" and isinstance(node, dict) and "class_path" in node:
                node["init_args"] = node.get("init_args") or {}
                node = node["init_args"]
            elif isinstance(node, dict) and isinstance(node.get(key), dict):
                node = node[key]
            else:
                break  # a task or network without the argument: the link leaves it alone
    return dumped


def check_linked_settings(config: Namespace, data: Any, given: set[str]) -> None:
    """A UserError when the command line or a config file sets a linked key (`LINKS`; `given`: `given_keys`) to
    other than what the data gives: the link would replace it without a word."""
    for source, target in LINKS:
        key = target.replace(".init_args", "")
        value, linked = _plain(config.get(target)), _plain(getattr(data, source, None))
        if key in given and value != linked:
            raise UserError(
                f"{key}={value} is set, but it comes from the data ({type(data).__name__}: data.{source}={linked}), "
                f"which fit links into it: leave {key} out and the data sets it"
            )


def given_keys(args: Sequence[str]) -> set[str]:
    """The keys a command line sets, by flag or in its config files, as dotted paths without `init_args`."""
    keys = set()
    for arg in map(str, args):
        if arg.startswith("--") and arg not in ("--config", "-c"):
            keys.add(arg[2:].split("=", 1)[0].replace(".init_args", ""))
    for path in config_files(args):
        with contextlib.suppress(OSError, yaml.YAMLError):
            keys |= _dotted(yaml.safe_load(Path(path).read_text()))
    return keys


def _dotted(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix} if prefix else set()
    keys = set()
    for name, value in tree.items():
        inner = prefix if name == "init_args" else f"{prefix}.{name}" if prefix else str(name)
        keys |= _dotted(value, inner)
    return keys


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def task_class(class_path: str) -> type | None:
    """The class a config's `class_path` names (the parser has checked it), or None."""
    module, _, name = str(class_path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _short_usage(parser: Any, file: Any = None) -> None:
    (file or sys.stderr).write(f"usage: {parser.prog} [--config CONFIG] [--KEY VALUE ...]\n")


def _one_line_error(parser: Any, message: str, ex: Exception | None = None) -> Any:
    return type(parser).error(parser, parse_error_line(message), ex)


class CommandLine(LightningCLI):
    """A command's config, parsed by LightningCLI and built into nothing: the command builds it, with its run's plan
    applied (project.cli.commands).

    Attributes:
        command: The command (`fit`, `validate`, `test`, `predict`), or None for the pieces alone.
        parser: LightningCLI's parser: the template's defaults, the default callbacks, the links data -> model.
        config: The config as given (what the run saves as its config.yaml).
        dumped: The same as plain values, dumped once (the run plan's settings, the task's saved hyperparameters).
        given: The keys the command line sets, by flag or in its config files.
        method_args: The Trainer method's own arguments of the command (`ckpt_path`, `weights_only`, ...).
    """

    def __init__(self, command: str | None, args: Sequence[str]) -> None:
        self.command = command
        self.method_args: list[str] = []
        args = [str(a) for a in args]
        self.given = given_keys(args)
        name = f"{USAGE} {command}" if command else USAGE
        super().__init__(
            model_class=ImageTask,
            subclass_mode_model=True,
            datamodule_class=ImageDataModule,
            subclass_mode_data=True,
            seed_everything_default=SEED,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=None,  # the command adds its own (project.callbacks.save_config)
            auto_configure_optimizers=False,
            parser_kwargs={
                "prog": name,
                "description": SUBCOMMANDS.get(str(command), "Image model settings."),
            },
            args=args,
            run=False,  # one parser, the command's: the command runs the Trainer itself
        )

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        # jsonargparse prints the full usage (hundreds of options) above a parse error; one line is enough,
        # with its tip to run --help and the error itself.
        parser.print_usage = types.MethodType(_short_usage, parser)
        parser.error = types.MethodType(_one_line_error, parser)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        self.method_args = add_project_arguments(parser, self.command)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        before_parsing(args)
        self.config = parser.parse_args(args)

    def before_instantiate_classes(self) -> None:
        # Dumped once, after the seed is chosen (`seed_everything: true` draws one), without validating: parsing
        # has just validated the config, and a validating dump checks every class in it again, rebuilding their
        # parsers, to write the same text. LightningCLI's instantiators (what a task built from the config
        # records for `load_from_checkpoint`) read this dump instead of making their own.
        # As JSON: read back in C, while a YAML text would be read by PyYAML's Python parser.
        text = self.parser.dump(
            self.config, format="json", skip_unset=False, skip_link_targets=False, skip_validation=True
        )
        self.dumped = with_room_for_links(json.loads(text))
        # (a copy, without secrets: they write the linked values into theirs, and a task saves its part of it
        # as its hyperparameters, in every checkpoint and logger)
        give_config_dump(self, redact_config(self.dumped))

    def instantiate_classes(self) -> None:
        """Nothing: the command instantiates the config, with its run's plan applied."""


def parse(command: str | None, args: Sequence[str]) -> CommandLine:
    """The config of `python -m project <command> <args>`, parsed (`--help` and `--print_config` answer here)."""
    quiet_lightning_notices()  # (again for a script or notebook that runs a command without `main`)
    return CommandLine(command, args)


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
    add_project_arguments(parser, "fit")
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
