"""What the tuning callbacks share: reporting a result, stopping after it, rebuilding optimizers."""

import functools
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from project import lightning_private


def report(trainer: L.Trainer, message: str, metrics: dict[str, float]) -> None:
    """Prints `message` once (rank 0) and records `metrics` in every logger (W&B: also in the run summary)."""
    if trainer.is_global_zero:
        print(message, flush=True)
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            logger.experiment.summary.update(metrics)
        logger.save()


def stop_after_tuning() -> None:
    """Ends `fit` cleanly right here, as Lightning's own Tuner ends a tuning-only run."""
    lightning_private.end_fit_cleanly()


def override_factory(module: L.LightningModule, attribute: str, **kwargs: Any) -> None:
    """Replaces `module.<attribute>` (an optimizer/scheduler factory) by the same factory with `kwargs` set."""
    # functools.partial flattens a partial of a partial, so the result is still introspectable.
    setattr(module, attribute, functools.partial(getattr(module, attribute), **kwargs))


def rebuild_optimizers(trainer: L.Trainer) -> None:
    """Calls `configure_optimizers` again, so schedules see a changed LR, batch size or number of steps."""
    trainer.strategy.setup_optimizers(trainer)
