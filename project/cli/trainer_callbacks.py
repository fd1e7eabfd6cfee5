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
    RichModelSummary,
    WeightAveraging,
)
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from torchmetrics import Metric, MetricCollection

from project.errors import UserError
from project.run.preemption import StopAndRequeue, StopTogether


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


class NetworkSummary(RichModelSummary):
    """Lightning's model summary of the network's layers: the task's metric objects (accuracies, running means,
    the best score so far) hold no parameters and would fill most of its rows."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        RichModelSummary.summarize(
            without_metrics(summary_data),
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
            **summarize_kwargs,
        )


def without_metrics(summary_data: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The columns of a model summary without the rows of torchmetrics modules, the rows numbered again."""
    metric_types = {MetricCollection.__name__} | {cls.__name__ for cls in subclasses(Metric)}
    kept = [i for i, name in enumerate(dict(summary_data)["Type"]) if name not in metric_types]
    columns = [(column, [values[i] for i in kept]) for column, values in summary_data]
    return [
        (column, [str(n) for n in range(len(kept))] if column == " " else values)
        for column, values in columns
    ]


def subclasses(cls: type) -> set[type]:
    """Every class imported so far that derives from `cls`."""
    direct = set(cls.__subclasses__())
    return direct.union(*(subclasses(sub) for sub in direct))
