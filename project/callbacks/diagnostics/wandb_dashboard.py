"""`WandbDashboard`: confusion matrix, worst-predicted images (or the panels of the task's kind of target) and
weight/gradient histograms in W&B."""

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from project.callbacks.diagnostics.wandb_charts import to_uint8
from project.data.targets import TargetKind


class WandbDashboard(Callback):
    """Adds what a W&B dashboard of an image classifier needs; does nothing without a `WandbLogger`.

    At the end of each validation epoch it logs `val/confusion_matrix` (a W&B confusion-matrix chart, over the
    whole validation set and all processes) and `val/worst_predictions`: a table of the validation images
    whose true class got the lowest probability, with true and predicted class and confidence. It reads the
    logits and targets that `validation_step` returns. A kind of target with panels of its own
    (`TargetKind.dashboard_panels`: per-tag precision-recall curves, predicted-vs-true scatter plots) logs those
    instead; targets that are not class indices without them, nothing. During fit it also has W&B
    record histograms of the parameters and/or gradients (`WandbLogger.watch`).

    Checkpoints are uploaded as W&B artifacts by the logger itself when it is online (`log_model: true`, see
    configs/logger/wandb_online.yaml); Lightning refuses that in offline mode.

    Args:
        confusion_matrix: Log the confusion matrix.
        worst_k: Number of worst-classified validation images in the table (0: no table).
        every_n_epochs: Log the matrix and the table every this many epochs (and at the last one).
        watch: Histograms to record: `gradients`, `parameters`, `all`, or `null` (off: for speed runs).
        watch_log_freq: Record the histograms every this many training steps.
    """

    def __init__(
        self,
        confusion_matrix: bool = True,
        worst_k: int = 16,
        every_n_epochs: int = 1,
        watch: Literal["gradients", "parameters", "all"] | None = "all",
        watch_log_freq: int = 500,
    ) -> None:
        super().__init__()
        if worst_k < 0 or every_n_epochs < 1 or watch_log_freq < 1:
            raise ValueError(
                "WandbDashboard: worst_k must be >= 0, every_n_epochs and watch_log_freq >= 1; got "
                f"{worst_k}, {every_n_epochs}, {watch_log_freq}"
            )
        self.confusion_matrix = confusion_matrix
        self.worst_k = worst_k
        self.every_n_epochs = every_n_epochs
        self.watch = watch
        self.watch_log_freq = watch_log_freq
        self._logger: WandbLogger | None = None
        self._watched: torch.nn.Module | None = None
        self._matrix: Tensor | None = None
        self._panels: Any = None  # those of the task's kind of target, when it draws its own
        self._worst: list[tuple[float, Tensor, Any, Any, float]] = []
        self._warned = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._logger = next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)

    # -- histograms -----------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._logger is not None and self.watch and trainer.is_global_zero:
            # The LightningModule, not its network: a network swapped during fit (QAT) stays covered.
            self._logger.watch(pl_module, log=self.watch, log_freq=self.watch_log_freq, log_graph=False)
            self._watched = pl_module

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # The W&B run starts now, in the background: off the path to the first step, up long before the first
        # metrics are logged (project.loggers.wandb.WandbLogger; Lightning's own started at setup).
        start = getattr(self._logger, "start", None) if self._logger is not None else None
        if callable(start):
            start()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._watched is not None and self._logger is not None:
            self._logger.experiment.unwatch(self._watched)
            self._watched = None

    # -- confusion matrix and worst predictions -------------------------------------------------------------
    def _active(self, trainer: L.Trainer) -> bool:
        if self._logger is None or trainer.sanity_checking:
            return False
        epoch = trainer.current_epoch
        last = trainer.max_epochs is not None and epoch == trainer.max_epochs - 1
        return (epoch + 1) % self.every_n_epochs == 0 or last or not trainer.training

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._matrix = None
        self._worst = []
        if self._panels is not None:
            self._panels.reset()

    @torch.no_grad()
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._active(trainer):
            return
        if not isinstance(outputs, dict) or "logits" not in outputs or "targets" not in outputs:
            if not self._warned:
                self._warned = True
                rank_zero_warn(
                    "WandbDashboard needs validation_step to return {'logits': ..., 'targets': ...}; "
                    f"{type(pl_module).__name__} returns {type(outputs).__name__}: no confusion matrix or table"
                )
            return
        logits, targets = outputs["logits"].float(), outputs["targets"]
        num_classes = logits.shape[1]
        kind = getattr(pl_module, "targets", None)
        if self._panels is None and isinstance(kind, TargetKind):
            self._panels = kind.dashboard_panels(self.worst_k)  # (None: the class panels here)
        if self._panels is not None:
            # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
            datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
            self._panels.update(logits, targets, batch[0], pl_module, lambda x: to_uint8(x, datamodule))
            return
        if targets.is_floating_point():
            return  # not class indices: a kind this dashboard has no charts for
        if self.confusion_matrix:
            if self._matrix is None:
                self._matrix = torch.zeros(num_classes, num_classes, dtype=torch.long, device=logits.device)
            pairs = targets * num_classes + logits.argmax(1)
            self._matrix += torch.bincount(pairs, minlength=num_classes**2).view(num_classes, num_classes)
        if self.worst_k:
            # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
            datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
            self._keep_worst(logits, targets, batch[0], datamodule)

    def _keep_worst(self, logits: Tensor, targets: Tensor, images: Tensor, datamodule: Any) -> None:
        probs = logits.softmax(1)
        p_true = probs.gather(1, targets[:, None]).squeeze(1)
        k = min(self.worst_k, len(p_true))
        if self._worst and k == self.worst_k and float(p_true.min()) >= self._worst[-1][0]:
            return  # nothing in this batch is worse than what is kept
        index = p_true.topk(k, largest=False).indices
        confidence, predicted = probs[index].max(1)
        pictures = to_uint8(images[index], datamodule)
        for i in range(k):
            self._worst.append(
                (
                    float(p_true[index[i]]),
                    pictures[i],
                    int(targets[index[i]]),
                    int(predicted[i]),
                    float(confidence[i]),
                )
            )
        self._worst = sorted(self._worst, key=lambda row: row[0])[: self.worst_k]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = self._logger
        if logger is None or not self._active(trainer):
            return
        names = list(getattr(pl_module, "class_names", None) or [])
        if self._panels is not None:  # the kind's own (computed on every process: they may sum states)
            charts = self._panels.charts(names, trainer.current_epoch, trainer.is_global_zero)
            if charts:
                logger.log_metrics(charts, step=trainer.global_step)
            return
        if self._matrix is None and not self._worst:
            return
        matrix = trainer.strategy.reduce(self._matrix, reduce_op="sum") if self._matrix is not None else None
        if not trainer.is_global_zero:
            return
        import wandb

        metrics: dict[str, Any] = {}
        if matrix is not None:
            matrix = matrix.cpu()
            names = names if len(names) == len(matrix) else [str(i) for i in range(len(matrix))]
            rows = [
                [names[i], names[j], int(matrix[i, j])] for i in range(len(names)) for j in range(len(names))
            ]
            metrics["val/confusion_matrix"] = wandb.plot_table(
                vega_spec_name="wandb/confusion_matrix/v1",
                data_table=wandb.Table(columns=["Actual", "Predicted", "nPredictions"], data=rows),
                fields={"Actual": "Actual", "Predicted": "Predicted", "nPredictions": "nPredictions"},
                string_fields={"title": f"Validation confusion matrix, epoch {trainer.current_epoch}"},
            )
        if self._worst:

            def name(index: int) -> str:
                return names[index] if index < len(names) else str(index)

            rows = [
                [wandb.Image(picture.permute(1, 2, 0).numpy()), name(true), name(pred), conf, p_true]
                for p_true, picture, true, pred, conf in self._worst
            ]
            metrics["val/worst_predictions"] = wandb.Table(
                columns=["image", "true", "predicted", "confidence", "p_true"], data=rows
            )
        logger.log_metrics(metrics, step=trainer.global_step)
