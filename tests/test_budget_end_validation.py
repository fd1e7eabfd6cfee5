"""A run that ends by its budget (`max_steps`, `max_time`) within an epoch validates once at its end.

The Lightning-level tests count validations of a tiny model under plain Trainers (with and without
`BudgetEndValidation`); the `fit` tests read a real run's metrics.csv and checkpoints.
"""

import csv
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks.budget_end_validation import BudgetEndValidation
from project.cli import main
from tests.folder_fits import tiny_fit_args, tiny_folder


class Tiny(L.LightningModule):
    """16 training samples in batches of 4: 4 steps an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.validated_at: list[int] = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def on_validation_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.validated_at.append(self.trainer.global_step)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def validations(tmp_path: Path, callbacks: list, **kwargs) -> list[int]:
    """The global steps at which a tiny fit validated."""
    model = Tiny()
    options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    options |= {"enable_checkpointing": False, "num_sanity_val_steps": 0}
    L.Trainer(default_root_dir=tmp_path, callbacks=callbacks, **options, **kwargs).fit(model)
    return model.validated_at


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"max_steps": 1}, [1]),  # within the first epoch: one validation, at its last step
        ({"max_steps": 6}, [4, 6]),  # the first epoch's, then the budget's end in the second
        ({"max_steps": 4}, [4]),  # at an epoch's end: that epoch's validation, not a second one
        ({"max_steps": 3, "accumulate_grad_batches": 3}, [2, 3]),  # optimizer steps, not batches
        ({"max_epochs": 2}, [4, 8]),  # not a budget: unchanged
        ({"max_steps": 1, "check_val_every_n_epoch": 2}, []),  # not a validation epoch: none, as Lightning
    ],
)
def test_the_budget_end_validates_once_and_nothing_else_changes(limits, expected, tmp_path):
    assert validations(tmp_path, [BudgetEndValidation()], **limits) == expected


def test_lightning_itself_does_not_validate_at_a_max_steps_within_an_epoch(tmp_path):
    """Why the callback exists: once Lightning validates there by itself, it can go."""
    assert validations(tmp_path, [], max_steps=1) == []


class SlowFirstBatch(Callback):
    """Spends over a second before the first training batch, so that a `max_time` of 1 s ends the run there."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 0:
            time.sleep(1.2)


def test_a_max_time_within_an_epoch_validates_at_the_stop(tmp_path):
    """Lightning's Timer stops the run through `should_stop`, for which it validates: nothing to add."""
    assert validations(tmp_path, [SlowFirstBatch()], max_time="00:00:00:01", max_epochs=5) == [1]


# -- fit ----------------------------------------------------------------------------------------------------


def _fit(tmp_path: Path, *extra: str) -> tuple[list[dict[str, str]], Path]:
    """A real `fit` (3 training batches an epoch) logging to CSV: (metrics.csv's validation rows, checkpoints/)."""
    data = tiny_folder(tmp_path / "images")
    logger = f"[{{class_path: CSVLogger, init_args: {{save_dir: {tmp_path / 'logs'}, name: runs}}}}]"
    main(["fit", *tiny_fit_args(data, tmp_path, "--trainer.logger", logger, *extra)])
    run = tmp_path / "logs" / "runs" / "version_0"
    with open(run / "metrics.csv") as f:
        return [row for row in csv.DictReader(f) if row["val/acc"]], run / "checkpoints"


def test_a_fit_shorter_than_an_epoch_validates_at_its_end_and_keeps_a_best_checkpoint(tmp_path):
    rows, checkpoints = _fit(tmp_path, "--trainer.max_steps", "2")
    assert [(row["epoch"], row["step"]) for row in rows] == [("0", "1")]
    (best,) = [p.name for p in checkpoints.glob("epoch*.ckpt")]
    assert best.startswith("epoch000-val_acc") and (checkpoints / "last.ckpt").is_file()


def test_a_fit_whose_max_steps_ends_an_epoch_validates_that_epoch_once(tmp_path):
    rows, _ = _fit(tmp_path, "--trainer.max_steps", "3")
    assert [(row["epoch"], row["step"]) for row in rows] == [("0", "2")]


class SavesAndValidations(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.events.append(("save", trainer.global_step))

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.events.append(("validate", trainer.global_step))


def test_no_checkpoint_between_the_budgets_last_step_and_its_validation(tmp_path):
    """A run killed during its budget-end validation resumes from an earlier step, redoes the last one and
    validates: a checkpoint already at max_steps would leave nothing to train or validate."""
    from project.callbacks import BestAndLastCheckpoint

    probe = SavesAndValidations()
    checkpoint = BestAndLastCheckpoint(
        dirpath=tmp_path / "ckpts", save_last=True, monitor="val_loss", last_every_n_train_steps=2
    )
    model = Tiny()
    options = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    L.Trainer(
        default_root_dir=tmp_path,
        callbacks=[probe, checkpoint, BudgetEndValidation()],
        max_steps=2,
        **options,
    ).fit(model)
    assert probe.events.index(("validate", 2)) < probe.events.index(("save", 2)), probe.events
