"""A command's config: its parser and defaults, read with LightningCLI, and the tools' command lines.

`python -m project fit|validate|test|predict` (project.cli.commands) and every tool (export, serve, cv, tune, ...)
read a config the same way: the template's defaults (loggers, the task), the default callbacks listed in
configs/callbacks/default.yaml (each under its own key), and the links data -> model. `parse` reads a command's
`--config` files and flags with LightningCLI's parser and builds nothing; `parse_fit_args` reads them for a tool;
a bad file, key or value is one line naming it. `parse_tool_args` makes a tool's command line from its typed,
documented function.
"""

import copy
import importlib
import inspect
import re
import sys
import types
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace  # pyright: ignore[reportPrivateImportUsage]  # exported, not in __all__
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from project import SUBCOMMANDS, USAGE, models
from project.callbacks import import_named
from project.cli.lightning_notices import quiet_lightning_notices
from project.data import ImageDataModule
from project.errors import UserError, find_user_error
from project.lightning_private import give_config_dump
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
#: The callbacks every run has, each under its own key: a file a user reads and edits, read as the parser is built.
DEFAULT_CALLBACKS = Path(__file__).resolve().parents[2] / "configs" / "callbacks" / "default.yaml"


@cache
def default_callbacks() -> dict[str, dict[str, Any]]:
    """The default callbacks (configs/callbacks/default.yaml): key -> `{class_path, init_args}`."""
    try:
        listed = yaml.safe_load(DEFAULT_CALLBACKS.read_text()) or {}
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
    if command == "fit":
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="Test the best checkpoint on the data's test split after fitting, where it has one",
        )

    # Each link applies where its target exists: a task or network without the argument is left alone.
    parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
    parser.link_arguments("data.class_names", "model.init_args.class_names", apply_on="instantiate")
    parser.link_arguments("data.input_shape", "model.init_args.input_shape", apply_on="instantiate")
    net = "model.init_args.net.init_args"
    parser.link_arguments("data.num_classes", f"{net}.num_classes", apply_on="instantiate")
    parser.link_arguments("data.input_shape", f"{net}.input_shape", apply_on="instantiate")
    return method_args


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
        method_args: The Trainer method's own arguments of the command (`ckpt_path`, `weights_only`, ...).
    """

    def __init__(self, command: str | None, args: Sequence[str]) -> None:
        self.command = command
        self.method_args: list[str] = []
        args = [str(a) for a in args]
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
        text = self.parser.dump(self.config, skip_unset=False, skip_link_targets=False, skip_validation=True)
        self.dumped = yaml.safe_load(text)
        give_config_dump(self, copy.deepcopy(self.dumped))  # (they write the linked values into theirs)

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
