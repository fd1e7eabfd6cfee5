"""`PredictionWriter`: `predict` results to a CSV, one row per input."""

import contextlib
import csv
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from project.atomic_files import atomic_path

if TYPE_CHECKING:
    from _csv import Writer  # what csv.writer returns; `csv` does not export the name

    from project.tasks.task import ImageTask


class PredictionWriter(BasePredictionWriter):
    """Writes one CSV row per input as batches are predicted: the input's name, then the task's own columns
    (`prediction_columns`, `prediction_row`: for `ImageClassifier`, class_index, class_name, probability; for
    `MultiLabelClassifier`, the labels and each tag's probability).

    The input is the image's path for folders, `<dataset>/<split>/<index>` for CIFAR. Rows are written per
    batch, so memory does not grow with the dataset. With several processes each writes its own part
    (`predictions-rank<N>.csv`).

    Args:
        output_path: The CSV file. Default: `predictions.csv` in the run's log directory (under
            `trainer.default_root_dir`).
    """

    def __init__(self, output_path: str | None = None) -> None:
        super().__init__(write_interval="batch")
        self.output_path = output_path
        self._open: contextlib.ExitStack | None = None  # the CSV being written, renamed into place at the end
        self._writer: Writer | None = None
        self.path: Path | None = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        default = Path(trainer.log_dir or trainer.default_root_dir) / "predictions.csv"
        path = Path(self.output_path) if self.output_path else default
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}-rank{trainer.global_rank}{path.suffix}")
        self.path = path
        self._open = contextlib.ExitStack()
        tmp = self._open.enter_context(atomic_path(path))
        self._writer = csv.writer(self._open.enter_context(open(tmp, "w", newline="")))  # noqa: SIM115 - spans hooks
        self._writer.writerow(["input", *_task(pl_module).prediction_columns()])

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        assert self._writer is not None  # opened by on_predict_start, which Lightning runs before any batch
        datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]  # set by Lightning
        names = getattr(datamodule, "predict_names", None) or []
        plain = {key: value.tolist() for key, value in prediction.items()}  # one device-to-host copy each
        task = _task(pl_module)
        for i, index in enumerate(plain["index"]):
            name = names[index] if index < len(names) else str(index)
            self._writer.writerow([name, *task.prediction_row(plain, i)])

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._open is not None:
            self._open, stack = None, self._open
            stack.close()  # closes the file, then moves it into place
            print(f"Predictions written to {self.path}")

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._open is not None:  # never leave a half-written CSV behind
            self._open, stack = None, self._open
            stack.__exit__(type(exception), exception, exception.__traceback__)


def _task(pl_module: L.LightningModule) -> "ImageTask":
    """The module as the task it is: the CLI builds every model as an `ImageTask` (`model_class`, subclass
    mode), which defines the CSV's columns."""
    return cast("ImageTask", pl_module)
