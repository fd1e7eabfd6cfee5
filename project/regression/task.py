"""`ImageRegressor`: real values per image (an angle, an age, a count), one network output per value."""

from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection

from project.data.targets import TargetKind
from project.regression.kind import Values
from project.tasks.task import ImageTask


class ImageRegressor(ImageTask):
    """Trains `net` to predict each image's `num_classes` values (`class_names` names them: `value` for one).

    With `standardize` the network learns the values standardised by the mean and std of the part of the data
    that trains (read from the DataModule's `train_targets` when a fit starts): a head of unit scale suits any
    units, and its outputs are turned back into the data's units for the metrics, the predictions, export and
    serving. The mean and std are buffers saved with the weights, and recorded in the checkpoint's `task` entry.
    Each evaluation logs `<stage>/mae` (validation's picks the best checkpoint; `cv` and `tune` minimise it) and
    `<stage>/rmse`, over every value; `predict` writes one column per value.

    Args:
        net: The network (any `nn.Module` mapping images to one output per value), injected from the config.
        num_classes: Number of values per image (the network's outputs); linked from the DataModule by the CLI.
        loss: `mse` (mean squared error), `l1` (mean absolute error) or `huber` (squared below 1, absolute above:
            in standardised units, a std away). On the standardised values when `standardize`.
        standardize: Train on values standardised by the training part's mean and std.
        **kwargs: The network, optimizer, schedule and speed settings every task has (`ImageTask`).
    """

    accepts: ClassVar[tuple[type[TargetKind], ...]] = (Values,)
    # part: csv
    example_config: ClassVar[str | None] = "configs/csv_regression.yaml"
    # /part: csv
    monitor: ClassVar[str] = f"val/{Values.metric}"
    monitor_mode: ClassVar[Literal["min", "max"]] = Values.mode

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 1,
        loss: Literal["mse", "l1", "huber"] = "mse",
        standardize: bool = True,
        **kwargs: Any,
    ) -> None:
        if num_classes < 1:
            raise ValueError(
                f"ImageRegressor: num_classes (values per image) must be at least 1, got {num_classes}"
            )
        super().__init__(net, **kwargs)
        self.class_names = self.class_names or (
            ["value"] if num_classes == 1 else [f"value{i}" for i in range(num_classes)]
        )
        # Saved with the weights: a resumed, evaluated or exported model un-standardises as it trained.
        self.register_buffer("target_mean", torch.zeros(num_classes))
        self.register_buffer("target_std", torch.ones(num_classes))

    target_mean: Tensor
    target_std: Tensor

    def make_metrics(self) -> MetricCollection:
        return MetricCollection({"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False)})

    def values(self, outputs: Tensor) -> Tensor:
        """The network's outputs in the data's units."""
        return torch.addcmul(self.target_mean, outputs.float(), self.target_std)

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        standardized = ((targets.float() - self.target_mean) / self.target_std).to(outputs.dtype)
        how = self.hparams["loss"]
        if how == "l1":
            return F.l1_loss(outputs, standardized)
        if how == "huber":
            return F.huber_loss(outputs, standardized)
        return F.mse_loss(outputs, standardized)

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        metrics.update(self.values(outputs), targets.float())

    def probabilities(self, outputs: Tensor) -> Tensor:
        return self.values(outputs)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Per input: its dataset index and its values."""
        x, index = batch
        return {"index": index, "values": self.values(self(x))}

    def prediction_columns(self) -> tuple[str, ...]:
        return tuple(self.class_names)

    def prediction_row(self, prediction: dict[str, Any], i: int) -> list[Any]:
        return [f"{v:.6g}" for v in prediction["values"][i]]

    def output_spec(self) -> dict[str, Any]:
        spec = super().output_spec()
        if not self.hparams["standardize"]:
            return spec
        # The network's outputs are standardised: deployment turns them into values with these.
        return spec | {
            "outputs": "standardized",
            "mean": [float(m) for m in self.target_mean],
            "std": [float(s) for s in self.target_std],
        }

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage != "fit" or not self.hparams["standardize"]:
            return
        targets = getattr(self.trainer.datamodule, "train_targets", None)  # pyright: ignore[reportAttributeAccessIssue]
        if not isinstance(targets, Tensor) or not len(targets):
            rank_zero_warn(
                "ImageRegressor: standardize needs the DataModule's train_targets (the training part's values); "
                "training on the values as they are"
            )
            return
        targets = targets.float().reshape(len(targets), -1)
        std = targets.std(0, correction=0) if len(targets) > 1 else torch.ones(targets.shape[1])
        self.target_mean.copy_(targets.mean(0))
        self.target_std.copy_(torch.where(std > 0, std, torch.ones_like(std)))
