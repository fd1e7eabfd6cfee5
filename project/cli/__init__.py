"""`python -m project`: LightningCLI for fit/validate/test/predict, plus the project's tool commands.

A `fit` reads top to bottom in `ProjectCLI`: 1. the config is parsed with `fit`'s parser (project.cli.config:
defaults, callbacks, the links data -> model) and 2. the run is planned (`parse_arguments`: run folder, checkpoint
to continue, what to monitor, the loggers' folders and W&B run; project.run.plan); 3. the data, task, trainer and
callbacks are built from the config with the plan applied (`instantiate_classes`, `configure_trainer`); 4. the
Trainer runs, between `before_<command>` and `after_<command>`. The task is chosen like the data, by class
(`model: {class_path: ImageClassifier, ...}`, the default), and decides what is monitored.
"""

import importlib
import signal
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

# Importing these makes their short class names (`class_path: SimpleCNN`) resolvable in configs.
import project.callbacks  # noqa: F401
import project.models  # noqa: F401
from project import SUBCOMMANDS, TOOLS, USAGE, print_commands
from project.callbacks import EffectiveBatchSize, interrupts
from project.callbacks.budget_end_validation import BudgetEndValidation
from project.callbacks.interrupts import CtrlCStopsAfterTheBatch
from project.callbacks.logs_before_checkpoints import LogsBeforeCheckpoints
from project.callbacks.rng_state import RNGState
from project.callbacks.run_info import RunInfo
from project.callbacks.save_config import LoggerSaveConfigCallback
from project.cli.config import (
    SEED,
    TRAINER_DEFAULTS,
    add_project_arguments,
    before_parsing,
    fit_parser,
    parse_error_line,
    parse_fit_args,
    split_args,
    task_class,
)
from project.cli.lightning_notices import quiet_lightning_notices
from project.cli.trainer_callbacks import applicable_callbacks, stop_on_signals
from project.data import ImageDataModule
from project.errors import UserError, find_user_error, innermost_value_error, warn
from project.lightning_private import LightningCLIWithTrainerHook
from project.loggers.wandb import finish_runs
from project.run.checkpoints import check_fits, with_atomic_checkpoint_io
from project.run.plan import RunPlan, check_accelerator, plan_run, precision_for_this_machine
from project.run.resume import keep_csv_metrics
from project.run.run_folder import release_run_folders
from project.run.startup import resume_garbage_collection
from project.tasks import ImageTask
from project.tasks.task import check_task_fits_data

__all__ = ["ProjectCLI", "fit_parser", "main", "parse_fit_args", "split_args", "SEED"]


def _short_usage(parser: Any, file: Any = None) -> None:
    (file or sys.stderr).write(f"usage: {parser.prog} [--config CONFIG] [--KEY VALUE ...]\n")


def _one_line_error(parser: Any, message: str, ex: Exception | None = None) -> Any:
    return type(parser).error(parser, parse_error_line(message), ex)


class ProjectCLI(LightningCLIWithTrainerHook):
    """LightningCLI with the template's defaults: links data -> model, default callbacks and loggers, and the
    run plan (project.run.plan) that makes every run resumable in place and safe to kill."""

    plan: RunPlan

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        argv = sys.argv[1:] if args is None else list(args)
        quiet_lightning_notices()
        # Only the requested subcommand's parser is built (each one introspects every class anew).
        self._requested = str(argv[0]) if run and argv and str(argv[0]) in super().subcommands() else None
        super().__init__(
            model_class=ImageTask,
            subclass_mode_model=True,
            datamodule_class=ImageDataModule,
            subclass_mode_data=True,
            seed_everything_default=SEED,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=LoggerSaveConfigCallback,
            save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
            auto_configure_optimizers=False,
            parser_kwargs={"prog": USAGE, "description": "Training and evaluation of an image model."},
            args=args,
            run=run,
            **kwargs,
        )

    def subcommands(self) -> dict[str, set[str]]:
        subcommands = super().subcommands()
        return {self._requested: subcommands[self._requested]} if self._requested else subcommands

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        # jsonargparse prints the full usage (hundreds of options) above a parse error; one line is enough,
        # with its tip to run --help and the error itself.
        parser.print_usage = types.MethodType(_short_usage, parser)
        parser.error = types.MethodType(_one_line_error, parser)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        add_project_arguments(parser)

    # -- 1. parse, 2. plan -----------------------------------------------------------------------------------
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if args is None or isinstance(args, list | tuple):  # (a dict or Namespace names no files)
            before_parsing(sys.argv[1:] if args is None else args)
        super().parse_arguments(parser, args)
        # Planned right away: before LightningCLI reads hyperparameters from `--ckpt_path`, which the plan checks.
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        # skip_validation: parsing has just validated the config; a validating dump checks every class in it
        # again, rebuilding their parsers, and writes the same text.
        text = self.parser.dump(self.config, skip_unset=False, skip_link_targets=False, skip_validation=True)
        dumped = yaml.safe_load(text)
        task = task_class(config.model.class_path)
        self.plan = plan_run(subcommand, config, dumped.get(subcommand, dumped), task)

    # -- 3. build ---------------------------------------------------------------------------------------------
    def instantiate_classes(self) -> None:
        # From a copy with the plan applied: self.config stays as given, and is what the run saves.
        try:
            self.config_init = self.parser.instantiate(self.plan.apply(self.config))
        except ValueError as e:
            # A class's own check of its settings (`label_smoothing must be in [0, 1)`), which jsonargparse
            # wraps in its search through the class types a key may take: the innermost message says it.
            raise find_user_error(e) or UserError(f"{innermost_value_error(e)}") from None
        built = self.config_init[self.subcommand] if self.subcommand else self.config_init
        self.datamodule, self.model = built["data"], built["model"]
        check_task_fits_data(self.model, self.datamodule)  # one class or a set of tags: before data is read
        # A pretrained network's weights expect inputs normalised as in their training: the data uses its
        # mean/std unless the config sets data.mean/data.std (a checkpoint's own, once loaded, win over both).
        net: Any = getattr(self.model, "net", None)
        if hasattr(net, "input_stats") and isinstance(self.datamodule, ImageDataModule):
            self.datamodule.use_network_stats(net.input_stats())
        self.trainer = self.instantiate_trainer()

    def configure_trainer(self, trainer_config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        check_accelerator(trainer_config.get("accelerator"))
        if (accumulate := trainer_config.get("accumulate_grad_batches", 1)) < 1:
            raise UserError(f"trainer.accumulate_grad_batches must be at least 1, got {accumulate}")
        trainer_config["precision"] = precision_for_this_machine(trainer_config.get("precision"))
        trainer_config["plugins"] = with_atomic_checkpoint_io(trainer_config.get("plugins"))
        callbacks = [*applicable_callbacks(self.subcommand, trainer_config, callbacks), EffectiveBatchSize()]
        if self.subcommand == "fit":  # (with a subcommand, there is a plan)
            # Every process stops at the same step on a signal to any one; every checkpoint carries the RNG
            # states and the run's identity; logs are on disk before it is.
            callbacks += [
                *stop_on_signals(trainer_config, callbacks),
                RNGState(),
                RunInfo(self.plan.settings),
                LogsBeforeCheckpoints(),
                CtrlCStopsAfterTheBatch(),
                BudgetEndValidation(),
            ]
        return callbacks

    # -- 4. run -------------------------------------------------------------------------------------------------
    def _before_run(self) -> None:
        """Start-up is over (project.run.startup): the collector runs again. Then a checkpoint that does not fit
        the network is one line with the mismatched keys and shapes, before anything runs (Lightning's own
        message is a wall of keys, after the data is loaded)."""
        resume_garbage_collection()
        if self.plan.ckpt_shapes is not None:
            from project.run.data_identity import check_checkpoint_file  # (a command from a checkpoint)

            check_checkpoint_file(self.model, str(self.plan.ckpt_path), self.subcommand == "fit")
            check_fits(self.model, self.plan.ckpt_shapes, source=f"checkpoint {self.plan.ckpt_path}")

    def before_fit(self) -> None:
        self._before_run()
        resume = self.plan.resume
        if resume is None or not self.trainer.is_global_zero:
            return
        # Lightning warns about the run's own checkpoint folder being non-empty: expected when continuing it.
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        for logger in self.trainer.loggers:
            if isinstance(logger, CSVLogger) and Path(logger.log_dir).resolve() == resume.run_dir:
                keep_csv_metrics(logger, before_step=resume.step)

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            print(fit_summary(self.trainer), flush=True)
        resume = self.plan.resume
        if resume is not None and self.trainer.is_global_zero and self.trainer.global_step == resume.step:
            warn(
                f"--ckpt_path last: the run in {resume.run_dir} had already reached the end of its training "
                f"(step {resume.step}); nothing was trained. To train longer, raise {self._limit_reached()}"
            )

    def _limit_reached(self) -> str:
        """The training length setting that ended the run, as a flag with its value."""
        trainer = self.trainer
        if 0 <= trainer.max_steps <= trainer.global_step:
            return f"--trainer.max_steps ({trainer.max_steps})"
        if trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch:
            return f"--trainer.max_epochs ({trainer.max_epochs})"
        return "--trainer.max_time, --trainer.max_steps or --trainer.max_epochs"

    before_validate = before_test = before_predict = _before_run


def fit_summary(trainer: Any) -> str:
    """The line a fit ends with: where its best checkpoint is and what it scored, and where its metrics are."""
    checkpoint = trainer.checkpoint_callback
    best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
    if best:
        score = checkpoint.best_model_score  # pyright: ignore[reportOptionalMemberAccess]
        scored = f" ({checkpoint.monitor} {float(score):.4f})" if score is not None else ""  # pyright: ignore
        line = f"best checkpoint: {best}{scored}"
    else:
        line = "no checkpoint was saved"
    folders = [logger.log_dir for logger in trainer.loggers if isinstance(logger, CSVLogger)]
    return f"{line}; metrics: {Path(folders[0]) / 'metrics.csv'}" if folders else line


def main(args: list[str] | None = None) -> None:
    """Entry point of `python -m project`."""
    argv = sys.argv[1:] if args is None else list(args)
    quiet_lightning_notices()
    try:
        if argv and argv[0] in TOOLS:
            resume_garbage_collection()  # (paused only for the subcommands; a tool may run for hours)
            module, function = TOOLS[argv[0]][0].split(":")
            getattr(importlib.import_module(module), function)(argv[1:])
            return
        if not argv or argv[0] in ("-h", "--help"):
            print_commands()
            return
        if not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
            print(
                f"error: unknown command {argv[0]!r}; the commands are {', '.join([*SUBCOMMANDS, *TOOLS])}",
                file=sys.stderr,
            )
            sys.exit(2)
        # args=None lets LightningCLI read sys.argv itself (passing both makes it warn).
        ProjectCLI(args=args)
        finish_runs(0)
    except SIGTERMException:  # preemption or Ctrl-C: stopped after a batch; BestAndLastCheckpoint saved it
        code = 128 + (signal.SIGINT if interrupts.stopped_by.startswith("Ctrl-C") else signal.SIGTERM)
        finish_runs(code)
        hint = (
            interrupts.resume_hint()
        )  # None in a fold or trial: cv or tune names the command that continues
        if hint:
            print(f"error: stopped by {interrupts.stopped_by}; {hint}", file=sys.stderr)
        sys.exit(code)
    except MisconfigurationException as exc:  # Lightning's word for settings it refuses: each names its key
        finish_runs(1)
        print(f"error: trainer: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        user_error = find_user_error(exc)
        if user_error is None:
            raise
        finish_runs(1)
        print(f"error: {user_error}", file=sys.stderr)
        sys.exit(1)
    finally:
        release_run_folders()
