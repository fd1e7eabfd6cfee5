"""Which callbacks a command's Trainer gets: the config's own, then the default ones that apply to the command
and its Trainer settings (configs/callbacks/default.yaml), then the one that saves the config beside the run."""

import warnings
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import (
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    WeightAveraging,
)
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from project.callbacks.preemption import StopAndRequeue, StopTogether
from project.callbacks.run_info import RunInfo
from project.callbacks.save_config import LoggerSaveConfigCallback
from project.cli.config import CommandLine, default_callbacks
from project.errors import UserError
from project.run.plan import RunPlan


def run_callbacks(
    command: CommandLine, built: Namespace, trainer: dict[str, Any], plan: RunPlan
) -> list[Callback]:
    """The Trainer's callbacks: the config's `trainer.callbacks`, then the default ones (configs/callbacks/
    default.yaml, each under its own key) that apply to this command and these Trainer settings, then the one
    that saves the config as given beside the run. Takes `trainer.callbacks` out of `trainer`, and edits it where
    a callback needs it."""
    own = list(trainer.pop("callbacks", None) or [])
    if command.command != "fit":  # a checkpoint's state_dict already holds the averaged weights
        own = [c for c in own if not isinstance(c, WeightAveraging)]
    defaults = [built[key] for key in default_callbacks() if built.get(key) is not None]
    defaults = applicable(command.command, trainer, defaults)
    if any(isinstance(c, StopTogether) for c in own):  # the config's own stop on signals replaces the default
        defaults = [c for c in defaults if not isinstance(c, StopTogether)]
    callbacks = [*own, *for_this_cluster(trainer, defaults)]
    check_weight_averaging(command.command, trainer, callbacks)
    for callback in callbacks:
        if isinstance(callback, RunInfo):
            callback.settings = plan.settings  # what `--ckpt_path last` matches, in every checkpoint
    if not trainer.get("fast_dev_run"):  # (LightningCLI's rule: a debug run saves no config)
        callbacks.append(
            LoggerSaveConfigCallback(command.parser, command.config, overwrite=True, save_to_log_dir=False)
        )
    return callbacks


def applicable(command: str | None, trainer: dict[str, Any], defaults: list[Any]) -> list[Any]:
    """The default callbacks that apply: one steps aside where the trainer flag it depends on is off, instead of
    raising (a callback of the config's own `trainer.callbacks` never does)."""
    drop: tuple[type, ...] = ()
    if command != "fit":  # nothing to checkpoint or schedule outside training
        drop += (ModelCheckpoint, LearningRateMonitor)
    if trainer.get("logger") in (False, None, []):
        drop += (LearningRateMonitor,)
    if trainer.get("enable_checkpointing") is False:
        drop += (ModelCheckpoint,)
    if trainer.get("enable_progress_bar") is False:
        drop += (ProgressBar,)
    if trainer.get("enable_model_summary") is False:
        drop += (ModelSummary,)
    defaults = [c for c in defaults if not isinstance(c, drop)]
    if any(isinstance(c, ModelSummary) for c in defaults):
        trainer["enable_model_summary"] = False  # ours is there: Lightning need not add its own
    return defaults


def for_this_cluster(trainer: dict[str, Any], defaults: list[Any]) -> list[Any]:
    """Inside a SLURM job whose config chose no cluster environment of its own, the default stop on signals
    (`StopTogether`) becomes `StopAndRequeue`: SLURM's preemption warning also requeues the job. Lightning's own
    SLURM handler, which saves a checkpoint inside the signal handler, is switched off."""
    plugins = trainer["plugins"]
    stops = [c for c in defaults if isinstance(c, StopTogether)]
    if not stops or not SLURMEnvironment.detect() or any(isinstance(p, ClusterEnvironment) for p in plugins):
        return defaults
    plugins.append(SLURMEnvironment(auto_requeue=False))
    swap = {
        id(c): StopAndRequeue(check_every_n_batches=c.check_every_n_batches)
        for c in stops
        if type(c) is StopTogether
    }
    return [swap.get(id(c), c) for c in defaults]


def check_weight_averaging(command: str | None, trainer: dict[str, Any], callbacks: list[Any]) -> None:
    """A weight average of a sharded network is refused in one line (every process would keep a whole copy)."""
    averaging = [c for c in callbacks if isinstance(c, WeightAveraging)]
    if command != "fit" or not averaging:
        return
    strategy = trainer.get("strategy")
    if isinstance(strategy, FSDPStrategy | ModelParallelStrategy):
        raise UserError(
            f"{type(averaging[0]).__name__} keeps a whole copy of the network in every process and cannot "
            f"average sharded weights (trainer.strategy {type(strategy).__name__}): train with DDP "
            "(configs/trainer/ddp.yaml) or without the weight average"
        )
    # Without sharding ImageTask.configure_model does nothing: WeightAveraging's warning that it might shard the
    # network is noise.
    warnings.filterwarnings("ignore", message="You're using the WeightAveraging callback with a model")
