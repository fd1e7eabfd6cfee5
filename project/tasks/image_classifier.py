"""`ImageClassifier`: one class per image, cross-entropy training of any image network, per-stage accuracy."""

from typing import Any, ClassVar, Literal

import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from project.data.targets import Classes, TargetKind
from project.errors import UserError
from project.tasks.task import ImageTask


class ImageClassifier(ImageTask):
    """Trains `net` to give each image one of `num_classes` classes.

    Args:
        net: The network (any `nn.Module` mapping images to one logit per class), injected from the config.
        num_classes: Number of classes; linked from the DataModule by the CLI.
        label_smoothing: Cross-entropy label smoothing (0.1 is a common choice).
        **kwargs: The network, optimizer, schedule and speed settings every task has (`ImageTask`).
    """

    accepts: ClassVar[tuple[type[TargetKind], ...]] = (Classes,)
    monitor: ClassVar[str] = f"val/{Classes.metric}"
    monitor_mode: ClassVar[Literal["min", "max"]] = Classes.mode
    prediction_header: ClassVar[tuple[str, ...]] = ("class_index", "class_name", "probability")

    def __init__(
        self, net: nn.Module, num_classes: int = 10, label_smoothing: float = 0.0, **kwargs: Any
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"ImageClassifier: num_classes must be at least 2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"ImageClassifier: label_smoothing must be in [0, 1), got {label_smoothing}")
        super().__init__(net, **kwargs)
        self.class_names = self.class_names or [str(i) for i in range(num_classes)]

    def setup(self, stage: str) -> None:
        super().setup(stage)  # first: data of another kind (one value per image) is told as such
        if self.hparams["num_classes"] < 2:
            raise UserError(
                f"ImageClassifier: num_classes must be at least 2, got {self.hparams['num_classes']}"
            )

    def make_metrics(self) -> MetricCollection:
        # average="micro": accuracy is the fraction of images classified correctly (MulticlassAccuracy's own
        # default, "macro", averages per class and counts a class absent from a partial run as 0).
        # compute_groups=False: torchmetrics would merge top-1 and top-k into one state if their states happen
        # to be equal after the first update (a fresh network that never ranks the first batch's class in its
        # top k, as on a class-sorted validation split), and top-k then silently reports top-1 for the run.
        # At least 2 wide: one class is refused at setup, once data of another kind (one value) has been told.
        num_classes = max(2, self.hparams["num_classes"])
        top5 = min(5, num_classes)
        return MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, top_k=1, average="micro"),
                f"acc_top{top5}": MulticlassAccuracy(num_classes, top_k=top5, average="micro"),
            },
            compute_groups=False,
        )

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        # Class indices, or (MixUp/CutMix) class probabilities: those in the outputs' dtype, as cross_entropy asks.
        targets = targets.to(outputs.dtype) if targets.is_floating_point() else targets
        return F.cross_entropy(outputs, targets, label_smoothing=self.hparams["label_smoothing"])

    def probabilities(self, outputs: Tensor) -> Tensor:
        return outputs.float().softmax(dim=-1)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Per input: its dataset index, the predicted class index and that class's probability."""
        x, index = batch
        probs = self.probabilities(self(x))
        prob, pred = probs.max(dim=-1)
        return {"index": index, "pred": pred, "prob": prob}

    def prediction_row(self, prediction: dict[str, Any], i: int) -> list[Any]:
        pred = prediction["pred"][i]
        return [pred, self.class_names[pred], f"{prediction['prob'][i]:.6f}"]
