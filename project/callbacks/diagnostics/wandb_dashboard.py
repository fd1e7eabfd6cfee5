"""`WandbDashboard`: confusion matrix (or per-tag AP and precision-recall curves), worst-classified images and
weight/gradient histograms in W&B."""

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MultilabelAveragePrecision, MultilabelPrecisionRecallCurve

#: Points of each tag's precision-recall curve (thresholds 0, 1/(n-1), ..., 1).
CURVE_POINTS = 21


class WandbDashboard(Callback):
    """Adds what a W&B dashboard of an image classifier needs; does nothing without a `WandbLogger`.

    At the end of each validation epoch it logs `val/confusion_matrix` (a W&B confusion-matrix chart, over the
    whole validation set and all processes) and `val/worst_predictions`: a table of the validation images
    whose true class got the lowest probability, with true and predicted class and confidence. It reads the
    logits and targets that `validation_step` returns. For a multi-label task (tags, `multilabel`) it logs
    instead `val/ap_per_tag` (a bar chart of each tag's average precision) and `val/pr_curve` (each tag's
    precision-recall curve), both over the whole validation set and all processes. During fit it also has W&B
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
        self._tags: MetricCollection | None = None  # per-tag AP and curves of a multi-label task
        self._worst: list[tuple[float, Tensor, int, int, float]] = []
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
        if self._tags is not None:
            self._tags.reset()

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
        if getattr(pl_module, "multilabel", False):
            self._update_tags(logits, targets, num_classes)
            return
        if self.confusion_matrix:
            if self._matrix is None:
                self._matrix = torch.zeros(num_classes, num_classes, dtype=torch.long, device=logits.device)
            pairs = targets * num_classes + logits.argmax(1)
            self._matrix += torch.bincount(pairs, minlength=num_classes**2).view(num_classes, num_classes)
        if self.worst_k:
            # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
            datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
            self._keep_worst(logits, targets, batch[0], datamodule)

    def _update_tags(self, logits: Tensor, targets: Tensor, num_tags: int) -> None:
        if self._tags is None:
            bins = torch.linspace(0, 1, CURVE_POINTS)
            self._tags = MetricCollection(
                {
                    "ap": MultilabelAveragePrecision(num_tags, average=None, thresholds=bins),
                    "curve": MultilabelPrecisionRecallCurve(num_tags, thresholds=bins),
                },
                compute_groups=False,
            ).to(logits.device)
        self._tags.update(logits.sigmoid(), targets.long())

    def _keep_worst(self, logits: Tensor, targets: Tensor, images: Tensor, datamodule: Any) -> None:
        probs = logits.softmax(1)
        p_true = probs.gather(1, targets[:, None]).squeeze(1)
        k = min(self.worst_k, len(p_true))
        if self._worst and k == self.worst_k and float(p_true.min()) >= self._worst[-1][0]:
            return  # nothing in this batch is worse than what is kept
        index = p_true.topk(k, largest=False).indices
        confidence, predicted = probs[index].max(1)
        pictures = _to_uint8(images[index], datamodule)
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
        tags = self._tags.compute() if self._tags is not None and self._tags["ap"].update_called else None
        if logger is None or not self._active(trainer):
            return
        if self._matrix is None and not self._worst and tags is None:
            return
        matrix = trainer.strategy.reduce(self._matrix, reduce_op="sum") if self._matrix is not None else None
        if not trainer.is_global_zero:
            return
        import wandb

        names = list(getattr(pl_module, "class_names", None) or [])
        metrics: dict[str, Any] = {}
        if tags is not None:
            metrics |= _tag_charts(tags, names, trainer.current_epoch)
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


def _tag_charts(tags: dict[str, Any], names: list[str], epoch: int) -> dict[str, Any]:
    """W&B charts of a multi-label validation: each tag's AP (bars) and precision-recall curve (lines)."""
    import wandb

    ap = tags["ap"].cpu()
    precision, recall, _ = (t.cpu() for t in tags["curve"])
    names = names if len(names) == len(ap) else [str(i) for i in range(len(ap))]
    bars = wandb.Table(columns=["tag", "AP"], data=[[n, float(v)] for n, v in zip(names, ap, strict=True)])
    points = [
        [names[i], float(r), float(p)]
        for i in range(len(names))
        for p, r in zip(precision[i], recall[i], strict=True)
        if not (p.isnan() or r.isnan())  # a tag without positives has no curve
    ]
    curves = wandb.Table(columns=["tag", "recall", "precision"], data=points)
    return {
        "val/ap_per_tag": wandb.plot.bar(bars, "tag", "AP", title=f"Validation AP per tag, epoch {epoch}"),
        "val/pr_curve": wandb.plot.line(
            curves, "recall", "precision", stroke="tag", title=f"Validation precision-recall, epoch {epoch}"
        ),
    }


def _to_uint8(images: Tensor, datamodule: Any) -> Tensor:
    """Normalised (N, C, H, W) images back to uint8 on the CPU, with the DataModule's mean and std."""
    images = images.detach().float().cpu()
    mean, std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
    if mean is not None and std is not None and len(mean) == images.shape[1]:
        shape = (1, -1, 1, 1)
        images = images * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)
    else:  # unknown normalisation: stretch each image to [0, 1]
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        high = images.amax(dim=(1, 2, 3), keepdim=True)
        images = (images - low) / (high - low).clamp_min(1e-8)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return images if images.shape[1] != 1 else images.expand(-1, 3, -1, -1)
