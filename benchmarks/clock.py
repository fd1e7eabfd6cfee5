"""`FitClock`: the step clock of benchmarks/step_clock.py as a Lightning callback, for `python -m project fit`."""

import lightning as L

from benchmarks.step_clock import StepClock, process_age


class FitClock(L.Callback):
    """`StepClock` for `python -m project fit`: `--trainer.callbacks+=benchmarks.clock.FitClock`."""

    def __init__(self, warmup: int = 100, variant: str = "template") -> None:
        self.clock, self.variant = StepClock(warmup), variant

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int
    ) -> None:
        self.clock.step(len(batch[0]))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # When training ended, counted like the first step: the rest of the wall time is the run's close.
        self.clock.report(variant=self.variant, train_end_s=round(process_age(), 2))
