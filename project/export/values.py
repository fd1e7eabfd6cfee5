"""The decoder of real values per image (regression, `ImageRegressor`): the `values` kind of
`project.export.decoding`."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from project.errors import UserError

Array = TypeVar("Array", np.ndarray, Tensor)


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
class Values:
    """Real values per image (regression), one output per target name: the values themselves (`outputs`:
    `values`), or standardised by the training data's `mean` and `std` (`standardized`), which an export
    turns back into values (its outputs are the values).

    `probabilities` (what the outputs mean as answers) gives the values; the quality figure is R² (the
    coefficient of determination, averaged over the targets: higher is better, as accuracy and mAP are).
    """

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

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], names: Sequence[str]) -> "Values":
        outputs = spec.get("outputs", "values")
        if outputs == "values":
            return cls(tuple(names))
        if outputs != "standardized":
            raise UserError(f"the outputs of a values model are values or standardized, not {outputs!r}")
        mean, std = (tuple(float(v) for v in spec.get(key) or ()) for key in ("mean", "std"))
        if not len(mean) == len(std) == len(names):
            raise UserError(
                f"the task record has {len(mean)} means and {len(std)} stds for {len(names)} standardized values"
            )
        return cls(tuple(names), mean, std)

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
