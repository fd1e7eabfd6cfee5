"""`python -m project`: LightningCLI for fit/validate/test/predict, plus the project's tool commands.

The CLI wires the pieces together and nothing more: the DataModule's `num_classes`, `class_names` and
`input_shape` are linked into the model when both are instantiated, so a config never states them twice.
"""

import importlib
import logging
import os
import signal
import sys
import warnings
from typing import Any

from lightning.pytorch.callbacks import (
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    RichModelSummary,
    RichProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import SIGTERMException

# Importing these makes their short class names (`class_path: SimpleCNN`) resolvable in configs.
import project.callbacks  # noqa: F401
import project.models  # noqa: F401
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
from project.errors import UserError
from project.lit import ImageClassifier
from project.reliable_cli import ReliableRunMixin

DEFAULT_ROOT_DIR = "logs"

# Noise a user cannot act on: an advert printed on every run, and a deprecation inside Lightning itself.
for _handler in logging.getLogger("lightning.pytorch").handlers:
    _handler.addFilter(lambda record: not record.getMessage().startswith("💡 Tip"))
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
warnings.filterwarnings(
    "ignore", message=r"(?s).*was deprecated in v4\.49\.0"
)  # jsonargparse API used by Lightning

# Loggers and their save_dir follow trainer.default_root_dir (see _follow_root_dir).
TRAINER_DEFAULTS: dict[str, Any] = {
    "default_root_dir": DEFAULT_ROOT_DIR,
    "logger": [
        # First logger: its versioned folder (logs/runs/version_N) holds the run's config and checkpoints.
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "name": "runs"},
        },
        # Offline unless WANDB_MODE=online (or `offline: false` in a config): no account, no network needed.
        {
            "class_path": "lightning.pytorch.loggers.WandbLogger",
            "init_args": {"save_dir": DEFAULT_ROOT_DIR, "project": "lightning-template", "offline": True},
        },
    ],
}


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config next to the run (config.yaml) and records it in every logger (W&B's run config)."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = self.config.as_dict()
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


class ProjectCLI(ReliableRunMixin, LightningCLI):
    """LightningCLI with the template's defaults: links data -> model, default callbacks and loggers."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=ImageDataModule,
            subclass_mode_data=True,
            seed_everything_default=42,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_callback=LoggerSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always-on callbacks, each configurable under its own key (e.g. --checkpoint.save_top_k 3).
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
        # Cheap training diagnostics and the W&B dashboard, on by default (issue 5; README "Training diagnostics").
        parser.add_lightning_class_args(GradientNormMonitor, "grad_norm")
        parser.add_lightning_class_args(NonFiniteGuard, "nonfinite_guard")
        parser.add_lightning_class_args(DataWaitMonitor, "data_wait")
        parser.add_lightning_class_args(WandbDashboard, "wandb_dashboard")

        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.input_shape", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        _follow_root_dir(config.trainer)
        super().before_instantiate_classes()  # ReliableRunMixin: W&B fallback, writable output, resume

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        # Default callbacks step aside when the trainer flag they depend on is off, instead of raising.
        drop: tuple[type, ...] = ()
        if self.subcommand != "fit":  # nothing to checkpoint or schedule outside training
            drop += (ModelCheckpoint, LearningRateMonitor)
        if config.get("logger") in (False, None, []):
            drop += (LearningRateMonitor,)
        if config.get("enable_checkpointing") is False:
            drop += (ModelCheckpoint,)
        if config.get("enable_progress_bar") is False:
            drop += (ProgressBar,)
        if config.get("enable_model_summary") is False:
            drop += (ModelSummary,)
        callbacks = [c for c in callbacks if not isinstance(c, drop)]
        # Derives the per-device batch from data.global_batch_size and prints the effective batch size (rank 0).
        callbacks.append(EffectiveBatchSize())
        return super()._instantiate_trainer(config, callbacks)


def _follow_root_dir(trainer_config: Any) -> None:
    """Point loggers left at the default folder to trainer.default_root_dir, and apply WANDB_MODE."""
    root = trainer_config.default_root_dir or DEFAULT_ROOT_DIR
    loggers = trainer_config.logger
    if not isinstance(loggers, list):
        loggers = [loggers] if loggers not in (None, True, False) else []
    for logger in loggers:
        init_args = getattr(logger, "init_args", None)
        if init_args is None:
            continue
        if str(init_args.get("save_dir")) == DEFAULT_ROOT_DIR:
            init_args["save_dir"] = root
        if logger.class_path.endswith("WandbLogger") and os.environ.get("WANDB_MODE", "").lower() in (
            "online",
            "run",
        ):
            init_args["offline"] = False
        wandb_offline = logger.class_path.endswith("WandbLogger") and init_args.get("offline")
        if wandb_offline and init_args.get("log_model"):
            # Lightning refuses log_model offline (checkpoints cannot be uploaded): keep them on disk instead.
            warnings.warn(
                "W&B is offline: checkpoints are not logged as artifacts (log_model needs online)",
                stacklevel=2,
            )
            init_args["log_model"] = False


def _user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind `exc`, if any (jsonargparse wraps errors raised while instantiating classes)."""
    while exc is not None:
        if isinstance(exc, UserError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# Tool commands beside LightningCLI's fit/validate/test/predict: name -> "module:function". Each function
# takes the remaining command-line arguments (list[str]) and parses them itself (jsonargparse).
TOOLS: dict[str, tuple[str, str]] = {
    "export": ("project.export.export:main", "export a checkpoint to ONNX and/or TorchScript"),
    "quantize": ("project.export.quantize:main", "INT8 quantization report: accuracy, latency, size"),
    "serve": ("project.serve.server:main", "HTTP prediction endpoint (LitServe)"),
    "predict_onnx": ("project.export.predict_onnx:main", "batched inference from an exported ONNX model"),
}


def _print_tools() -> None:
    print("\nTool commands (python -m project <tool> --help):")
    for name, (_, summary) in TOOLS.items():
        print(f"  {name:<10} {summary}")


def _finish_wandb(exit_code: int) -> None:
    """Close the W&B run before the process exits. Lightning's WandbLogger never calls `wandb.finish()` and
    leaves it to wandb's exit hook, which on a loaded machine could end the process before wandb's service had
    written the last rows and the run's exit record (a run directory missing its final epoch)."""
    wandb = sys.modules.get("wandb")  # imported only if a WandbLogger was used
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)


def main(args: list[str] | None = None) -> None:
    """Entry point of `python -m project`."""
    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv and argv[0] in TOOLS:
            module, function = TOOLS[argv[0]][0].split(":")
            getattr(importlib.import_module(module), function)(argv[1:])
            return
        # args=None lets LightningCLI read sys.argv itself (passing both makes it warn).
        if not argv or argv[0] in ("-h", "--help"):
            try:
                ProjectCLI(args=args)
            finally:
                _print_tools()
            return
        ProjectCLI(args=args)
        _finish_wandb(0)
    except SIGTERMException:  # preemption: Lightning stopped after a batch; BestAndLastCheckpoint saved it
        _finish_wandb(128 + signal.SIGTERM)
        print(
            "error: stopped by SIGTERM; resume with the same command plus --ckpt_path last", file=sys.stderr
        )
        sys.exit(128 + signal.SIGTERM)
    except Exception as exc:
        user_error = _user_error(exc)
        if user_error is None:
            raise
        _finish_wandb(1)
        print(f"error: {user_error}", file=sys.stderr)
        sys.exit(1)
