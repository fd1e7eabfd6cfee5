"""`BestAndLastCheckpoint`: Lightning's ModelCheckpoint with `last.ckpt` always the latest state."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import lightning_private as private
from project.callbacks import interrupts


class BestAndLastCheckpoint(ModelCheckpoint):
    """Keeps the best checkpoints by the monitored metric and, with `save_last`, the latest one.

    Lightning 2.6 refreshes `last.ckpt` only when a top-k checkpoint is saved in the same step, so after an
    epoch that does not improve the metric, resuming from it silently repeats epochs. This subclass writes
    `last.ckpt` at every save point, every `last_every_n_train_steps` optimizer steps within an epoch (a kill
    loses at most that many steps), and when the run is stopped by SIGTERM (preemption: Lightning stops after
    the current batch; a first Ctrl-C is turned into one by project.callbacks.interrupts).

    A best checkpoint's file name says its epoch and monitored value (`epoch004-val_acc0.8123.ckpt`) unless
    `filename` is given; the monitored metric itself is the task's (`ImageTask.monitor`) unless `monitor` is.

    Args:
        last_every_n_train_steps: Also refresh `last.ckpt` every this many optimizer steps (0: only at the
            end of each epoch/validation). The best-k checkpoints are still chosen at validation only.
        **kwargs: ModelCheckpoint's arguments (monitor, mode, save_top_k, save_last, filename, ...).
    """

    def __init__(self, *args: Any, last_every_n_train_steps: int = 1000, **kwargs: Any) -> None:
        monitor = kwargs.get("monitor")
        if monitor and kwargs.get("filename") is None:
            kwargs["filename"] = f"epoch{{epoch:03d}}-{monitor.replace('/', '_')}{{{monitor}:.4f}}"
            kwargs["auto_insert_metric_name"] = False
        super().__init__(*args, **kwargs)
        if last_every_n_train_steps < 0:
            raise ValueError(f"last_every_n_train_steps must be >= 0, got {last_every_n_train_steps}")
        self.last_every_n_train_steps = last_every_n_train_steps
        self._last_refreshed_step = -1

    def _refresh_last(self, trainer: L.Trainer) -> None:
        if self.save_last and not private.skips_saving(self, trainer):
            private.save_last(self, trainer)
            self._last_refreshed_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        # Never after an epoch's last batch: Lightning resumes such a checkpoint in the next epoch, skipping this
        # one's validation and end (on SIGTERM it cuts the validation short; the resumed run redoes the batch).
        if private.ends_epoch(trainer):
            return
        # Nor after the budget's last step: that step validates before the run ends (BudgetEndValidation), and a
        # run resumed from a checkpoint at max_steps would have nothing left to train or validate.
        if 0 <= trainer.max_steps <= trainer.global_step:
            return
        # On SIGTERM Lightning stops right after this hook: save here, at the usual point of a step checkpoint.
        n = self.last_every_n_train_steps
        if (n and trainer.global_step % n == 0) or trainer.received_sigterm:
            # A periodic save must not count as "saved at this step": the epoch-end save that may follow at the
            # same step still has to choose the best-k checkpoints and record the validation results.
            saved_before = private.last_saved_step(self)
            self._refresh_last(trainer)
            private.set_last_saved_step(self, saved_before)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before the first validation (a run stopped within its first epoch) there is nothing to rank, and
        # ModelCheckpoint would only warn that the monitored metric is missing. last.ckpt still is written.
        if not self.monitor or self.monitor in trainer.callback_metrics:
            super().on_train_epoch_end(trainer, pl_module)
        self._refresh_last(trainer)  # unless a save at this step (top-k, a validation's) wrote it already

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not private.saves_on_train_epoch_end(self, trainer):
            self._refresh_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning 2.6's on_train_end writes last.ckpt without asking `_should_skip_saving_checkpoint`: a
        # `fast_dev_run` (documented to write no checkpoint) would leave one for `--ckpt_path last` to resume.
        if not private.skips_saving(self, trainer):
            super().on_train_end(trainer, pl_module)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        super().on_exception(trainer, pl_module, exception)
        if not isinstance(exception, SIGTERMException) or trainer.sanity_checking:
            return
        if trainer.validating:  # no state to save within a validation: the resumed run validates again
            if self.last_model_path:
                rank_zero_info(
                    f"{interrupts.stopped_by} during validation: the latest state is in {self.last_model_path}"
                )
            else:  # the first validation, before any checkpoint
                rank_zero_info(
                    f"{interrupts.stopped_by} during the first validation: no checkpoint was saved yet"
                )
            return
        # SIGTERM that arrived after this step's on_train_batch_end: the state is still between two batches.
        if self._last_refreshed_step != trainer.global_step:
            self._refresh_last(trainer)
        rank_zero_info(
            f"{interrupts.stopped_by}: the state at step {trainer.global_step} is in {self.last_model_path}"
        )
