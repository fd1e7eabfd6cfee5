"""`DataWaitMonitor`: the share of each training step spent waiting for the next batch."""

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from project.callbacks.diagnostics.grad_norm import logs_this_step
from project.machine import available_cpus


class DataWaitMonitor(Callback):
    """Logs the fraction of training time spent waiting for batches (`train/data_wait_step`: since the last
    logged step; `train/data_wait_epoch`: over the epoch) and warns when training is data-bound, saying what
    to change. It logs only on the steps the trainer logs (`log_every_n_steps`): a `log` call per batch costs
    more than the measurement.

    The wait is the time from the end of one training step to the start of the next: fetching the batch from the
    DataLoader, copying it to the device and the DataModule's on-device augmentation. The first batch of each
    epoch (worker start-up) is left out of the epoch mean. On a GPU the host runs ahead of the device, so the
    numbers mean "host time" unless `synchronize` is on (or something in the step synchronises, such as the
    progress bar reading the loss).

    Args:
        warn_above: Warn at the end of an epoch whose mean wait fraction exceeds this.
        min_batches: Judge only epochs with at least this many measured batches.
        synchronize: Wait for the device at the end of each step (exact GPU numbers, slightly slower training).
    """

    def __init__(self, warn_above: float = 0.3, min_batches: int = 10, synchronize: bool = False) -> None:
        super().__init__()
        if not 0.0 < warn_above <= 1.0:
            raise ValueError(f"DataWaitMonitor.warn_above must be in (0, 1], got {warn_above}")
        self.warn_above = warn_above
        self.min_batches = min_batches
        self.synchronize = synchronize
        self._last_end: float | None = None
        self._step_start = 0.0
        self._wait = 0.0
        self._epoch_wait = self._epoch_total = 0.0
        self._window_wait = self._window_total = 0.0  # since the last logged step
        self._batches = 0
        self._warned = False

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = None
        self._epoch_wait = self._epoch_total = self._window_wait = self._window_total = 0.0
        self._batches = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        self._wait = now - self._last_end if self._last_end is not None else -1.0
        self._step_start = now

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.synchronize and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = time.perf_counter()
        if self._wait >= 0:
            total = self._wait + (now - self._step_start)
            self._epoch_wait += self._wait
            self._epoch_total += total
            self._window_wait += self._wait
            self._window_total += total
            self._batches += 1
        if self._window_total > 0 and logs_this_step(trainer, stepped=True):
            pl_module.log("train/data_wait_step", self._window_wait / self._window_total, batch_size=1)
            self._window_wait = self._window_total = 0.0
        self._last_end = time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = None  # validation in the middle of an epoch is not data wait

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_total <= 0:
            return
        fraction = self._epoch_wait / self._epoch_total
        pl_module.log("train/data_wait_epoch", fraction, on_step=False, on_epoch=True, batch_size=1)
        if self._batches >= self.min_batches and fraction > self.warn_above and not self._warned:
            self._warned = True  # once per run: the advice does not change from epoch to epoch
            # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
            datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
            rank_zero_warn(
                f"training is data-bound: {fraction:.0%} of each step (epoch {trainer.current_epoch} mean) waits "
                f"for the next batch. {advice(datamodule)}"
            )


def advice(datamodule: Any) -> str:
    """What to change in the data pipeline, given the DataModule's settings."""
    tips = []
    if hasattr(datamodule, "num_workers"):
        workers = datamodule.num_workers
        now = "auto" if workers is None else workers
        tips.append(f"more DataLoader workers (--data.num_workers, now {now}; {available_cpus()} CPUs here)")
    if hasattr(datamodule, "on_device") and not datamodule.on_device:
        tips.append("the tensor-resident path for in-memory datasets such as CIFAR (--data.on_device true)")
    if hasattr(datamodule, "cache") and not getattr(datamodule, "cache", True):
        tips.append("the decoded-image cache for image folders (--data.cache true)")
    if not tips:
        tips.append(
            "more DataLoader workers, keeping the dataset in memory or on the device, caching decoded images"
        )
    return "Try: " + "; ".join(tips) + "."
