"""`BudgetEndValidation`: a run that ends by `max_steps` in the middle of an epoch validates at its last step."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from project import lightning_private as private


class BudgetEndValidation(Callback):
    """Validates once at the step where `trainer.max_steps` ends a run within an epoch.

    Lightning 2.6 validates at the end of an epoch (or every `val_check_interval`) only: a run whose
    `max_steps` falls inside an epoch stops without a validation, so it keeps no best checkpoint and a study
    gets no metric from it. At that step this callback sets `trainer.should_stop`, the public way to end a
    run early, for which Lightning validates right after the batch, as it does for EarlyStopping (the
    validation epochs chosen by `check_val_every_n_epoch` and the `min_epochs`/`min_steps` floor still apply).

    A `max_time` that ends the run within an epoch needs nothing here: Lightning's Timer stops the run the same
    way. A budget that ends at an epoch's last batch is left alone: that epoch validates anyway, once. Runs
    ended by `max_epochs` never reach the condition. Since the stop comes after the step's training batch, the
    validation follows it as it would at an epoch's end, and the checkpoints are written after it as usual.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        budget = trainer.max_steps
        if budget == -1 or trainer.global_step < budget or private.ends_epoch(trainer):
            return
        trainer.should_stop = True
