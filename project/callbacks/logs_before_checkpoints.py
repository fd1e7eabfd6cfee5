"""`LogsBeforeCheckpoints`: the loggers' rows are on disk before each checkpoint is."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class LogsBeforeCheckpoints(Callback):
    """Writes the loggers' buffered rows to disk before each checkpoint is saved.

    Lightning writes CSVLogger's rows after each of its own logging calls, but rows that callbacks log directly
    (LearningRateMonitor's, at the start of an epoch) wait in memory for the next one. A process killed after a
    checkpoint but before that write would lose them, and the run resumed from the checkpoint does not log those
    steps again. Written here, the logs on disk cover every step a checkpoint holds (`keep_csv_metrics` drops
    the rows after it).
    """

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for logger in trainer.loggers:
            logger.save()  # on rank zero; nothing to do for loggers that write as they go
