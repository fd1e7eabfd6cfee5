"""`BestAndLastCheckpoint`: Lightning's ModelCheckpoint with `last.ckpt` always the latest state."""

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class BestAndLastCheckpoint(ModelCheckpoint):
    """Keeps the best checkpoints by the monitored metric and, with `save_last`, the latest one.

    Lightning 2.6 refreshes `last.ckpt` only when a top-k checkpoint is saved in the same step, so after an
    epoch that does not improve the metric, `last.ckpt` still holds an older state and resuming from it
    silently repeats epochs. This subclass writes `last.ckpt` at every save point. Every argument is
    ModelCheckpoint's.
    """

    def _refresh_last(self, trainer: L.Trainer) -> None:
        if (
            self.save_last
            and not self._should_skip_saving_checkpoint(trainer)
            and self._last_global_step_saved != trainer.global_step
        ):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)
