"""`MultiLabelClassifier`: any number of tags per image, sigmoid outputs trained with binary cross-entropy.

Each output is an independent yes/no per tag. Validation ranks the model by macro mean average precision
(`val/map`, threshold-free) and picks each tag's decision threshold: the one that maximises that tag's F1 on
the validation split (`val/f1` is the mean F1 at those thresholds, so it flatters; `test/f1` is measured at the
thresholds validation chose). The thresholds are saved with the weights (a buffer) and in the checkpoint's
`task` record, so `predict`, `export` and `serve` answer the same label sets.
"""

from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MultilabelAveragePrecision, MultilabelPrecisionRecallCurve

from project.data.targets import TargetKind
from project.errors import UserError
from project.tags.kind import Tags
from project.tasks.task import ImageTask

#: The candidate thresholds (0, 0.01, ..., 1): the precision-recall curves are counted at these probabilities,
#: so their state is a fixed-size table that processes sum, whatever the size of the split.
THRESHOLD_BINS = 101
DEFAULT_THRESHOLD = 0.5


def bins() -> Tensor:
    return torch.linspace(0, 1, THRESHOLD_BINS)


def f1_per_bin(precision: Tensor, recall: Tensor) -> Tensor:
    """F1 (tags, bins) from a binned curve's precision and recall (0 where nothing is predicted)."""
    p, r = precision[:, :THRESHOLD_BINS], recall[:, :THRESHOLD_BINS]
    return torch.nan_to_num(2 * p * r / (p + r), nan=0.0)


class MultiLabelClassifier(ImageTask):
    """Trains `net` to give each image the subset of `num_classes` tags that apply to it.

    Args:
        net: The network (any `nn.Module` mapping images to one logit per tag), injected from the config.
        num_classes: Number of tags; linked from the DataModule by the CLI.
        pos_weight: Weight of the positive examples of each tag in the loss: `none` (1), or `balanced`:
            the tag's negatives / positives in the training part (rare tags count as much as common ones),
            counted in the DataModule's `train_targets` when training starts.
        max_pos_weight: Largest `balanced` weight: a tag seen a handful of times would otherwise dominate.
        **kwargs: The network, optimizer, schedule and speed settings every task has (`ImageTask`).
    """

    accepts: ClassVar[tuple[type[TargetKind], ...]] = (Tags,)
    # part: csv
    example_config: ClassVar[str | None] = "configs/csv_multilabel.yaml"
    # /part: csv
    monitor: ClassVar[str] = f"val/{Tags.metric}"
    monitor_mode: ClassVar[Literal["min", "max"]] = Tags.mode
    prediction_header: ClassVar[tuple[str, ...]] = ("labels",)

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        pos_weight: Literal["none", "balanced"] = "none",
        max_pos_weight: float = 100.0,
        **kwargs: Any,
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"MultiLabelClassifier: num_classes must be at least 1, got {num_classes}")
        if max_pos_weight < 1:
            raise ValueError(f"MultiLabelClassifier: max_pos_weight must be >= 1, got {max_pos_weight}")
        super().__init__(net, **kwargs)
        self.class_names = self.class_names or [str(i) for i in range(num_classes)]
        # Saved with the weights: the thresholds of the validation that chose the checkpoint, and the loss's
        # weights (a resumed or evaluated run uses the very same).
        self.register_buffer("thresholds", torch.full((num_classes,), DEFAULT_THRESHOLD))
        self.register_buffer("pos_weight", torch.ones(num_classes))
        # Per-tag AP and precision-recall curves of the evaluation splits (the curves choose the thresholds).
        per_tag = MetricCollection(
            {
                "ap": MultilabelAveragePrecision(max(2, num_classes), average=None, thresholds=bins()),
                "curve": MultilabelPrecisionRecallCurve(max(2, num_classes), thresholds=bins()),
            },
            compute_groups=False,
        )
        self.val_tags, self.test_tags = per_tag.clone(prefix="val/"), per_tag.clone(prefix="test/")

    thresholds: Tensor
    pos_weight: Tensor

    # -- what the task defines ------------------------------------------------------------------------------
    def make_metrics(self) -> MetricCollection:
        # Binned: a fixed-size state summed over processes, like the curves.
        # At least 2 wide: one tag is refused at setup, once data of another kind (one value) has been told.
        num_classes = max(2, self.hparams["num_classes"])
        return MetricCollection(
            {"map": MultilabelAveragePrecision(num_classes, average="macro", thresholds=bins())}
        )

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        # Probabilities, not logits: torchmetrics guesses logits only from values outside [0, 1].
        probs, labels = outputs.float().sigmoid(), targets.long()
        metrics.update(probs, labels)
        per_tag = {"val/": self.val_tags, "test/": self.test_tags}.get(metrics.prefix or "")
        if per_tag is not None:
            per_tag.update(probs, labels)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        weight = self.pos_weight if self.hparams["pos_weight"] == "balanced" else None
        return F.binary_cross_entropy_with_logits(outputs, targets.to(outputs.dtype), pos_weight=weight)

    def probabilities(self, outputs: Tensor) -> Tensor:
        return outputs.float().sigmoid()

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Per input: its dataset index, each tag's probability, and whether it reaches the tag's threshold."""
        x, index = batch
        probs = self.probabilities(self(x))
        return {"index": index, "probs": probs, "tagged": probs >= self.thresholds}

    def prediction_columns(self) -> tuple[str, ...]:
        return (*self.prediction_header, *(f"p_{name}" for name in self.class_names))

    def prediction_row(self, prediction: dict[str, Any], i: int) -> list[Any]:
        labels = [
            name for name, tagged in zip(self.class_names, prediction["tagged"][i], strict=True) if tagged
        ]
        return [" ".join(labels), *(f"{p:.6f}" for p in prediction["probs"][i])]

    def output_spec(self) -> dict[str, Any]:
        return super().output_spec() | {"thresholds": [round(float(t), 6) for t in self.thresholds]}

    # -- pos_weight from the training tags ------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.hparams["num_classes"] < 2:
            raise UserError(
                f"MultiLabelClassifier: num_classes must be at least 2 tags, got {self.hparams['num_classes']}"
            )
        if stage == "fit" and self.hparams["pos_weight"] == "balanced":
            targets = getattr(self.trainer.datamodule, "train_targets", None)  # pyright: ignore[reportAttributeAccessIssue]
            if not isinstance(targets, Tensor) or targets.ndim != 2:
                rank_zero_warn(
                    "MultiLabelClassifier: pos_weight balanced needs the DataModule's train_targets (the multi-hot "
                    "rows of the part that trains); training with pos_weight 1"
                )
                return
            images, positives = len(targets), targets.sum(0)
            weight = (images - positives) / positives.clamp_min(1)
            self.pos_weight.copy_(
                weight.clamp(1 / self.hparams["max_pos_weight"], self.hparams["max_pos_weight"])
            )

    # -- thresholds, F1 and per-tag AP at the end of each evaluation ----------------------------------------
    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            precision, recall, _ = self.val_tags["val/curve"].compute()  # summed over every process
            f1 = f1_per_bin(precision, recall)
            seen = ~recall[:, 0].isnan()  # tags with a positive image in the split
            best = f1.argmax(dim=1)
            chosen = bins().to(self.thresholds)[best.to(self.thresholds.device)]
            # A tag without a positive image in the split keeps its threshold: no F1 can choose one.
            self.thresholds.copy_(torch.where(seen.to(chosen.device), chosen, self.thresholds))
            self._log_tags("val", f1.gather(1, best[:, None]).squeeze(1), seen)
        self.val_tags.reset()
        super().on_validation_epoch_end()

    def on_test_epoch_end(self) -> None:
        precision, recall, _ = self.test_tags["test/curve"].compute()
        f1 = f1_per_bin(precision, recall)
        # The bin of each tag's threshold (thresholds are chosen among the bins, so it is exact).
        at = torch.bucketize(self.thresholds.cpu(), bins()).clamp_max(THRESHOLD_BINS - 1).to(f1.device)
        self._log_tags("test", f1.gather(1, at[:, None]).squeeze(1), ~recall[:, 0].isnan())
        self.test_tags.reset()

    def _log_tags(self, stage: str, f1: Tensor, seen: Tensor) -> None:
        """`<stage>/f1` (mean over the tags the split has) and `<stage>/ap/<tag>`; the values are the same on
        every process already (computed from summed states)."""
        f1 = f1[seen].mean() if bool(seen.any()) else torch.tensor(float("nan"))
        values = {f"{stage}/f1": f1}
        ap = self.val_tags if stage == "val" else self.test_tags
        for name, value in zip(self.class_names, ap[f"{stage}/ap"].compute(), strict=True):
            values[f"{stage}/ap/{name}"] = value
        self.log_dict(values, sync_dist=True)  # identical on every process: tells Lightning so
