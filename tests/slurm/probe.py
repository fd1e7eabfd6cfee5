"""A callback for the preemption tests: where each process is, and where it stopped."""

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class StepProbe(Callback):
    """Writes `rank{R}.step` (the global step, after every training batch) and, when the run stops early,
    `rank{R}.stop` (the step it stopped at) into `folder`."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        (self.folder / f"rank{trainer.global_rank}.step").write_text(str(trainer.global_step))

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        (self.folder / f"rank{trainer.global_rank}.stop").write_text(str(trainer.global_step))
