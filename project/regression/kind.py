"""`Values`: real values per image (regression), and everything that follows from it: float32 targets, splits and
folds stratified by quantile bins, mean absolute error, the decoding (and un-standardising) of the outputs for
export and serving, the W&B panels of a validation, and how a CSV writes an image's values."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from project.data.label_checks import shown
from project.data.targets import TargetKind
from project.errors import UserError

Array = TypeVar("Array", np.ndarray, Tensor)

#: At most this many quantile bins stratify a split of real values, and at least this many images fill one.
VALUE_BINS, IMAGES_PER_BIN = 10, 5
#: Validation images of the first process in the dashboard's scatter plots, at most.
SCATTER_POINTS = 2000


@dataclass(frozen=True)
class Values(TargetKind):
    """Real values per image (regression): float32 rows (N, values); MixUp mixes the values themselves."""

    kind: ClassVar[str] = "values"
    noun: ClassVar[str] = "value"
    described: ClassVar[str] = "real values per image"
    metric: ClassVar[str] = "mae"
    mode: ClassVar[Literal["min", "max"]] = "min"
    per_name_metric: ClassVar[str] = "mae"
    per_name_words: ClassVar[str] = "mean absolute error"

    @classmethod
    def example(cls) -> tuple["Values", list[Any]]:
        return cls(("angle", "size")), [(float(i * 7 % 11) - 5.0, i / 4) for i in range(20)]

    def encode(self, labels: Sequence[Any]) -> Tensor:
        return torch.tensor(labels, dtype=torch.float32).reshape(len(labels), len(self.names))

    def stored(self, label: Any) -> Any:
        return np.asarray(label, dtype=np.float32).reshape(len(self.names))

    def strata(self, labels: Sequence[Any]) -> list[int] | None:
        """The quantile bin of each image's first value (ties broken by position): a split keeps the spread of
        values, as a class split keeps each class's share."""
        if not len(labels):
            return []
        first = np.asarray([label[0] for label in labels], dtype=np.float64)
        bins = max(1, min(VALUE_BINS, len(first) // IMAGES_PER_BIN))
        ranks = np.empty(len(first), dtype=np.int64)
        ranks[np.argsort(first, kind="stable")] = np.arange(len(first))
        return (ranks * bins // len(first)).tolist()

    def score(self, outputs: Tensor, targets: Tensor) -> float:
        """Mean absolute error over every value."""
        return float((outputs.double() - targets.double()).abs().mean())

    def per_name(self, outputs: Tensor, targets: Tensor) -> dict[str, float | None]:
        errors = (outputs.double() - targets.double()).abs().reshape(len(targets), -1)
        if not len(errors):
            return dict.fromkeys(self.names)
        return {name: float(errors[:, i].mean()) for i, name in enumerate(self.names)}

    def output_spec(self) -> dict[str, Any]:
        return {"kind": "values", "outputs": "values", "decode": "the outputs are the values"}

    def decoder(self, spec: Mapping[str, Any]) -> "ValuesDecoder":
        outputs = spec.get("outputs", "values")
        if outputs == "values":
            return ValuesDecoder(self.names)
        if outputs != "standardized":
            raise UserError(f"the outputs of a values model are values or standardized, not {outputs!r}")
        mean, std = (tuple(float(v) for v in spec.get(key) or ()) for key in ("mean", "std"))
        if not len(mean) == len(std) == len(self.names):
            raise UserError(
                f"the task record has {len(mean)} means and {len(std)} stds for {len(self.names)} standardized "
                "values"
            )
        return ValuesDecoder(self.names, mean, std)

    def dashboard_panels(self, worst_k: int) -> "ValuePanels":
        return ValuePanels(worst_k)

    # -- an image's values as a CSV writes them (a CSV source reads its label cells through these) -------------
    @classmethod
    def read_cells(
        cls,
        cells: list[str],
        columns: list[str],
        per_name: bool,
        separator: str | None,
        named: Callable[[str], str],
    ) -> tuple[float, ...]:
        """An image's values, one per cell; a ValueError saying why for text that is not a finite number."""
        values = []
        for name, cell in zip(columns, cells, strict=True):
            try:
                value = float(cell) if cell.strip() else None
            except ValueError:
                value = float("nan")
                why = "is not a number"
            else:
                why = "is empty" if value is None else "is not a finite number"
            if value is None or not np.isfinite(value):
                raise ValueError(
                    f"the value {shown(cell)} in column {name!r} {why}: data.kind values reads a real number per image"
                )
            values.append(value)
        return tuple(values)

    @classmethod
    def names_read(
        cls, labels: list[Any], rows: list[int], columns: list[str], per_name: bool, separator: str | None,
        where: str,
    ) -> list[str]:  # fmt: skip
        """The names of the values: the CSV's `columns` (per_name), or `value` for one."""
        return list(columns) if per_name else ["value"]

    @staticmethod
    def indexed(label: tuple[float, ...], index: dict[str, int]) -> tuple[float, ...]:
        return label


class Unstandardize(nn.Module):
    """Outputs standardised per value -> the values: `mean + outputs * std` (what a standardising regression
    task's export appends to its network)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    mean: Tensor
    std: Tensor

    def forward(self, x: Tensor) -> Tensor:
        return torch.addcmul(self.mean, x.float(), self.std)


@dataclass(frozen=True)
class ValuesDecoder:
    """How export, predict_onnx, serve and quantize read a regression: the values themselves, or standardised by
    the training data's `mean` and `std`, which an export turns back into values (its outputs are the values).
    The quality figure is R² (averaged over the values: higher is better, as accuracy and mAP are)."""

    names: tuple[str, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    #: Two variants agree on an image when every value is within this share of the reference's (or of 1).
    tolerance: ClassVar[float] = 0.01
    quality: ClassVar[str] = "R²"
    agrees: ClassVar[str] = "values agree with FP32 (1%)"
    quality_note: ClassVar[str] = (
        "R² (coefficient of determination, the mean over the targets; agreement: every value within 1% of "
        "FP32 eager's, or within 0.01 where that is below 1)"
    )
    output_name: ClassVar[str] = "values"

    def deployable(self, net: nn.Module) -> nn.Module:
        if self.mean is None or self.std is None:
            return net
        return nn.Sequential(net, Unstandardize(self.mean, self.std))

    def exported(self, spec: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in spec.items() if k not in ("mean", "std")}
        return kept | {"outputs": "values", "decode": "the outputs are the values"}

    def probabilities(self, outputs: Array) -> Array:
        if self.mean is None or self.std is None:
            return outputs
        if isinstance(outputs, Tensor):
            return Unstandardize(self.mean, self.std).to(outputs.device)(outputs)
        return np.asarray(self.mean) + outputs.astype(np.float64) * np.asarray(self.std)

    def csv_header(self) -> list[str]:
        return list(self.names)

    def csv_row(self, probs: np.ndarray) -> list[Any]:
        return [f"{float(v):.6g}" for v in probs]

    def answer(self, probs: np.ndarray, top_k: int = 1) -> dict[str, Any]:
        return {"values": {name: float(v) for name, v in zip(self.names, probs, strict=True)}}

    def describe(self) -> dict[str, Any]:
        return {"kind": "values", "names": list(self.names)}

    def reduce(self, outputs: np.ndarray) -> np.ndarray:
        return np.asarray(self.probabilities(outputs), dtype=np.float32)

    def score(self, reduced: np.ndarray, targets: np.ndarray) -> float:
        from torchmetrics.functional import r2_score

        values = torch.from_numpy(reduced).double().reshape(len(reduced), -1)
        truth = torch.from_numpy(np.asarray(targets)).double().reshape(len(reduced), -1)
        return float(r2_score(values, truth, multioutput="uniform_average"))

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        limit = self.tolerance * np.maximum(np.abs(reference), 1.0)
        close = np.abs(reduced - reference) <= limit
        return float(close.reshape(len(close), -1).all(axis=1).mean())


@dataclass
class ValuePanels:
    """The W&B dashboard of a regression's validation: predicted against true values (`val/predicted_vs_true`, a
    scatter plot per value of up to SCATTER_POINTS images of the first process) and the `worst_k` images
    predicted furthest from their values (`val/worst_predictions`)."""

    worst_k: int
    points: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (predicted, true), on the CPU
    worst: list[tuple[float, Tensor, Any, Any, float]] = field(default_factory=list)

    def reset(self) -> None:
        self.points, self.worst = [], []

    def update(self, outputs: Tensor, targets: Tensor, images: Tensor, pl_module: Any, pictures: Any) -> None:
        predicted = pl_module.probabilities(outputs).float().reshape(len(outputs), -1)
        true = targets.float().reshape(len(targets), -1)
        room = SCATTER_POINTS - sum(len(p) for p, _ in self.points)
        if room > 0:
            self.points.append((predicted[:room].cpu(), true[:room].cpu()))
        if not self.worst_k:
            return
        error = (predicted - true).abs().amax(1)  # the furthest of an image's values
        k = min(self.worst_k, len(error))
        if self.worst and k == self.worst_k and float(error.max()) <= -self.worst[-1][0]:
            return
        index = error.topk(k).indices
        shown_images = pictures(images[index])
        for i, row in enumerate(index.tolist()):
            self.worst.append((-float(error[row]), shown_images[i], true[row].tolist(), predicted[row].tolist(),
                               float(error[row])))  # fmt: skip
        self.worst = sorted(self.worst, key=lambda entry: entry[0])[: self.worst_k]

    def charts(self, names: list[str], epoch: int, first: bool) -> dict[str, Any]:
        if not self.points or not first:
            return {}
        import wandb

        predicted, true = (torch.cat(column) for column in zip(*self.points, strict=True))
        names = names if len(names) == predicted.shape[1] else [str(i) for i in range(predicted.shape[1])]
        charts: dict[str, Any] = {}
        for i, name in enumerate(names):
            points = [[float(t), float(p)] for t, p in zip(true[:, i], predicted[:, i], strict=True)]
            table = wandb.Table(columns=["true", "predicted"], data=points)
            key = "val/predicted_vs_true" if len(names) == 1 else f"val/predicted_vs_true/{name}"
            title = f"Validation {name}: predicted vs true, epoch {epoch}"
            charts[key] = wandb.plot.scatter(table, "true", "predicted", title=title)
        if self.worst:
            rows = [
                [wandb.Image(picture.permute(1, 2, 0).numpy()), str(t), str(p), error]
                for _, picture, t, p, error in self.worst
            ]
            charts["val/worst_predictions"] = wandb.Table(
                columns=["image", "true", "predicted", "abs_error"], data=rows
            )
        return charts
