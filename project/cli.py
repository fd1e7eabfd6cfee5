"""`python -m project`: LightningCLI for fit/validate/test/predict, plus the project's tool commands.

The CLI wires the pieces together and nothing more: the DataModule's `num_classes`, `class_names` and
`input_shape` are linked into the model when both are instantiated, so a config never states them twice.
The default callbacks are configurable under their own keys (`--checkpoint.save_top_k 3`); the reliability
layer (`project.run`) adds safe checkpoints, in-place resume and one-line errors.
"""

import importlib
import logging
import signal
import sys
import warnings
from typing import Any

from jsonargparse import ActionConfigFile, Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import (
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

# Importing these makes their short class names (`class_path: SimpleCNN`) resolvable in configs.
import project.callbacks  # noqa: F401
import project.models  # noqa: F401
from project import SUBCOMMANDS, TOOLS, USAGE, print_commands
from project.callbacks import (
    BestAndLastCheckpoint,
    DataWaitMonitor,
    EffectiveBatchSize,
    GradientNormMonitor,
    NonFiniteGuard,
    PredictionWriter,
    WandbDashboard,
)
from project.data import ImageDataModule
from project.errors import UserError, find_user_error
from project.lit import ImageClassifier
from project.run import interrupts
from project.run.lightning_private import LightningCLIWithHooks
from project.run.provenance import LoggerSaveConfigCallback
from project.run.reliable_run import ReliableRunMixin
from project.run.run_folder import DEFAULT_ROOT_DIR, release_run_folders
from project.run.wandb_logger import finish_runs

SEED = 42

# Noise a user cannot act on: an advert printed on every run, and a deprecation inside Lightning itself.
NOISE = ("💡 Tip", "Loading `train_dataloader` to estimate number of stepping batches")
for _handler in logging.getLogger("lightning.pytorch").handlers:
    _handler.addFilter(lambda record: not record.getMessage().startswith(NOISE))
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
warnings.filterwarnings("ignore", message=r"(?s).*was deprecated in v4\.49\.0")  # jsonargparse, by Lightning

# Loggers left at save_dir `logs` follow trainer.default_root_dir (project.run.run_folder).
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
            "class_path": "project.run.wandb_logger.WandbLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "project": "lightning-template", "offline": True},
        },
    ],
}


def add_project_arguments(parser: LightningArgumentParser) -> None:
    """The always-on callbacks, each configurable under its own key, and the data -> model links."""
    parser.add_lightning_class_args(BestAndLastCheckpoint, "checkpoint")
    parser.set_defaults(
        {
            "checkpoint.monitor": "val/acc",
            "checkpoint.mode": "max",
            "checkpoint.save_last": True,
            "checkpoint.filename": "epoch{epoch:03d}-val_acc{val/acc:.4f}",
            "checkpoint.auto_insert_metric_name": False,
        }
    )
    parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
    parser.add_lightning_class_args(RichProgressBar, "progress_bar")
    parser.add_lightning_class_args(RichModelSummary, "model_summary")
    parser.set_defaults({"model_summary.max_depth": 2})
    parser.add_lightning_class_args(PredictionWriter, "prediction_writer")
    # Cheap training diagnostics and the W&B dashboard (README "Training diagnostics").
    parser.add_lightning_class_args(GradientNormMonitor, "grad_norm")
    parser.add_lightning_class_args(NonFiniteGuard, "nonfinite_guard")
    parser.add_lightning_class_args(DataWaitMonitor, "data_wait")
    parser.add_lightning_class_args(WandbDashboard, "wandb_dashboard")

    parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
    parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
    parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
    parser.link_arguments("data.input_shape", "model.input_shape", apply_on="instantiate")


class ProjectCLI(ReliableRunMixin, LightningCLIWithHooks):
    """LightningCLI with the template's defaults: links data -> model, default callbacks and loggers."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        argv = sys.argv[1:] if args is None else list(args)
        # Only the requested subcommand's parser is built (each one introspects every class anew).
        self._requested = str(argv[0]) if run and argv and str(argv[0]) in super().subcommands() else None
        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=ImageDataModule,
            subclass_mode_data=True,
            seed_everything_default=SEED,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=LoggerSaveConfigCallback,
            save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
            auto_configure_optimizers=False,
            parser_kwargs={"prog": USAGE, "description": "Training and evaluation of an image classifier."},
            args=args,
            run=run,
            **kwargs,
        )

    def subcommands(self) -> dict[str, set[str]]:
        subcommands = super().subcommands()
        return {self._requested: subcommands[self._requested]} if self._requested else subcommands

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        add_project_arguments(parser)

    def configure_trainer(self, trainer_config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        # Default callbacks step aside when the trainer flag they depend on is off, instead of raising.
        drop: tuple[type, ...] = ()
        if self.subcommand != "fit":  # nothing to checkpoint or schedule outside training
            drop += (ModelCheckpoint, LearningRateMonitor)
        if trainer_config.get("logger") in (False, None, []):
            drop += (LearningRateMonitor,)
        if trainer_config.get("enable_checkpointing") is False:
            drop += (ModelCheckpoint,)
        if trainer_config.get("enable_progress_bar") is False:
            drop += (ProgressBar,)
        if trainer_config.get("enable_model_summary") is False:
            drop += (ModelSummary,)
        callbacks = [c for c in callbacks if not isinstance(c, drop)]
        if any(isinstance(c, ModelSummary) for c in callbacks):
            trainer_config["enable_model_summary"] = False  # ours is there: Lightning need not add its own
        # Derives the per-device batch from data.global_batch_size and prints the effective batch size (rank 0).
        callbacks.append(EffectiveBatchSize())
        return super().configure_trainer(trainer_config, callbacks)


def fit_parser() -> LightningArgumentParser:
    """The parser of `python -m project fit`, built without running anything: for the tool commands, which read
    a run's config files (or its saved config.yaml) and instantiate only the pieces they need."""
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_argument("--seed_everything", type=bool | int, default=SEED)
    parser.add_lightning_class_args(Trainer, "trainer")
    parser.set_defaults({f"trainer.{key}": value for key, value in TRAINER_DEFAULTS.items()})
    parser.add_lightning_class_args(ImageClassifier, "model")
    parser.add_lightning_class_args(ImageDataModule, "data", subclass_mode=True)
    add_project_arguments(parser)
    parser.add_method_arguments(Trainer, "fit", skip=set(LightningCLI.subcommands()["fit"]))
    return parser


def parse_fit_config(configs: list[str], overrides: list[str] | None = None) -> Namespace:
    """Parse `--config` files (later ones win) and `--model.*`/`--data.*` overrides as `fit` would, instantiating
    nothing; a bad file, key or value is a UserError naming it."""
    args = [a for path in configs for a in ("--config", str(path))] + list(overrides or [])
    try:
        return fit_parser().parse_args(args)
    except Exception as e:  # jsonargparse's ArgumentError (exit_on_error=False): name the key and value
        raise UserError(str(e).strip().splitlines()[0]) from None


def main(args: list[str] | None = None) -> None:
    """Entry point of `python -m project`."""
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv and argv[0] in TOOLS:
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
        print(
            f"error: stopped by {interrupts.stopped_by}; resume with the same command plus --ckpt_path last",
            file=sys.stderr,
        )
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
