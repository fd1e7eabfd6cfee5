"""Which callbacks a run's Trainer gets: the configured ones that apply to this subcommand and these trainer
settings, and the stop on signals every `fit` has."""

import warnings
from typing import Any

from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    WeightAveraging,
)
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from project.callbacks.preemption import StopAndRequeue, StopTogether
from project.errors import UserError


def applicable_callbacks(
    subcommand: str | None, trainer_config: dict[str, Any], callbacks: list[Any]
) -> list[Any]:
    """The callbacks of the configured callback keys that apply: default callbacks step aside when the trainer
    flag they depend on is off, instead of raising. Edits `trainer_config` where the run needs it."""
    drop: tuple[type, ...] = ()
    if subcommand != "fit":  # nothing to checkpoint or schedule outside training
        drop += (ModelCheckpoint, LearningRateMonitor)
        # Nor to average: a checkpoint's state_dict already holds the averaged weights.
        trainer_config["callbacks"] = [
            c for c in trainer_config.get("callbacks") or [] if not isinstance(c, WeightAveraging)
        ]
    elif averaging := [c for c in trainer_config.get("callbacks") or [] if isinstance(c, WeightAveraging)]:
        strategy = trainer_config.get("strategy")
        if isinstance(strategy, FSDPStrategy | ModelParallelStrategy):
            raise UserError(
                f"{type(averaging[0]).__name__} keeps a whole copy of the network in every process and cannot "
                f"average sharded weights (trainer.strategy {type(strategy).__name__}): train with DDP "
                "(configs/trainer/ddp.yaml) or without the weight average"
            )
        # Without sharding ImageTask.configure_model does nothing: WeightAveraging's warning that it might
        # shard the network is noise.
        warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback with a model")
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
    return callbacks


def stop_on_signals(trainer_config: dict[str, Any], callbacks: list[Any]) -> list[Callback]:
    """The stop every `fit` has, unless the config names one: a signal to any one process stops every process
    at the same step (Lightning's own handlers can hang a run of several processes). Inside a SLURM job the
    preemption warning also requeues it, and Lightning's SLURM handler, which saves a checkpoint inside the
    signal handler, is switched off."""
    if any(isinstance(c, StopTogether) for c in [*callbacks, *(trainer_config.get("callbacks") or [])]):
        return []
    if under_slurm(trainer_config["plugins"]):
        trainer_config["plugins"].append(SLURMEnvironment(auto_requeue=False))
        return [StopAndRequeue()]
    return [StopTogether()]


def under_slurm(plugins: list[Any]) -> bool:
    """A run inside a SLURM job whose config chose no cluster environment of its own."""
    return SLURMEnvironment.detect() and not any(isinstance(p, ClusterEnvironment) for p in plugins)
