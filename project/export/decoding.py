"""What a trained network's outputs mean, and how they become answers: one decoder per kind of target.

The task records its kind in every checkpoint (`ImageTask.output_spec`, the `task` entry, copied into an export's
model.json): `kind` is absent for one class per image (`ImageClassifier`), `tags` for a set of tags per image
(`MultiLabelClassifier`), `values` for real values per image (`ImageRegressor`: `names` are its targets).
`decoder_for` turns that record into the object `export`, `predict_onnx`, `serve` and `quantize` ask: what to
export (the network, or the network followed by its activation or un-standardisation), how raw outputs become
probabilities (or values), the CSV row and HTTP answer of one image, and the quality figure of a batch. A new
kind of target is one class (here, or in a module of its own as `values.py` holds `Values`) and its entry in
`DECODERS`.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from project.errors import UserError
from project.export.values import Values

Array = TypeVar("Array", np.ndarray, Tensor)


class Decoder(Protocol):
    """How the outputs of one kind of task are read (see the module docstring)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    #: The quality figure `score` returns, and what `agreement` compares, as the quantization report says them.
    quality: ClassVar[str]
    agrees: ClassVar[str]
    quality_note: ClassVar[str]
    #: The name of an exported model's output (ONNX).
    output_name: ClassVar[str]

    def deployable(self, net: nn.Module) -> nn.Module:
        """What `export` writes: the network, or the network with its outputs made probabilities."""
        ...

    def exported(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The task record of what `deployable` returns, for model.json."""
        ...

    def probabilities(self, outputs: Array) -> Array:
        """Outputs (B, names) -> probabilities (numpy or torch, as given)."""
        ...

    def csv_header(self) -> list[str]: ...

    def csv_row(self, probs: np.ndarray) -> list[Any]:
        """The CSV cells of one image's probabilities (after its name)."""
        ...

    def answer(self, probs: np.ndarray, top_k: int = 1) -> dict[str, Any]:
        """`serve`'s JSON answer for one image's probabilities."""
        ...

    def describe(self) -> dict[str, Any]:
        """What `serve`'s /info adds about the outputs."""
        ...

    def reduce(self, outputs: np.ndarray) -> np.ndarray:
        """What `score` and `agreement` need of a batch's outputs (kept for a whole split: small)."""
        ...

    def score(self, reduced: np.ndarray, targets: np.ndarray) -> float:
        """The quality figure of a split (quantize): top-1 accuracy, or mAP."""
        ...

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        """The fraction of images on which two variants give the same answer."""
        ...


def _logits_in(spec: Mapping[str, Any]) -> bool:
    # Checkpoints and exports written before tasks recorded their outputs hold logits.
    return spec.get("outputs", "logits") == "logits"


@dataclass(frozen=True)
class OneClass:
    """One class per image: outputs are logits; softmax, then the most probable class."""

    names: tuple[str, ...]
    logits: bool = True
    quality: ClassVar[str] = "accuracy"
    agrees: ClassVar[str] = "top-1 agrees with FP32"
    quality_note: ClassVar[str] = "Accuracy: top-1"
    output_name: ClassVar[str] = "logits"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], names: Sequence[str]) -> "OneClass":
        return cls(tuple(names), _logits_in(spec))

    def deployable(self, net: nn.Module) -> nn.Module:
        return net

    def exported(self, spec: dict[str, Any]) -> dict[str, Any]:
        return spec

    def probabilities(self, outputs: Array) -> Array:
        if not self.logits:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs.float().softmax(dim=-1)
        z = outputs.astype(np.float64)  # stably, in float64
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def csv_header(self) -> list[str]:
        return ["class_index", "class_name", "probability"]

    def csv_row(self, probs: np.ndarray) -> list[Any]:
        index = int(probs.argmax())
        return [index, self.names[index], f"{probs[index]:.6f}"]

    def answer(self, probs: np.ndarray, top_k: int = 1) -> dict[str, Any]:
        index = int(probs.argmax())
        answer: dict[str, Any] = {
            "class_name": self.names[index],
            "class_index": index,
            "probability": float(probs[index]),
        }
        if top_k > 1:
            top = np.argsort(-probs)[:top_k]
            answer["top_k"] = [{"class_name": self.names[i], "probability": float(probs[i])} for i in top]
        return answer

    def describe(self) -> dict[str, Any]:
        return {}

    def reduce(self, outputs: np.ndarray) -> np.ndarray:
        return outputs.argmax(axis=1)  # the top-1 class: softmax keeps the order

    def score(self, reduced: np.ndarray, targets: np.ndarray) -> float:
        return float((reduced == targets).mean())

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        return float((reduced == reference).mean())


@dataclass(frozen=True)
class Tags:
    """Any number of tags per image: sigmoid per tag, then every tag whose probability reaches its threshold.

    An export writes the network followed by its sigmoid: the ONNX/TorchScript outputs are probabilities.
    """

    names: tuple[str, ...]
    thresholds: tuple[float, ...]
    logits: bool = True
    quality: ClassVar[str] = "mAP"
    agrees: ClassVar[str] = "tag sets agree with FP32"
    quality_note: ClassVar[str] = (
        "mAP (macro mean average precision over the tags; agreement: the same tag set at the thresholds)"
    )
    output_name: ClassVar[str] = "probabilities"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], names: Sequence[str]) -> "Tags":
        thresholds = tuple(float(t) for t in spec.get("thresholds") or [0.5] * len(names))
        if len(thresholds) != len(names):
            raise UserError(f"the task record has {len(thresholds)} thresholds for {len(names)} tags")
        return cls(tuple(names), thresholds, _logits_in(spec))

    def deployable(self, net: nn.Module) -> nn.Module:
        return nn.Sequential(net, nn.Sigmoid()) if self.logits else net

    def exported(self, spec: dict[str, Any]) -> dict[str, Any]:
        return spec | {
            "outputs": "probabilities",
            "decode": "every tag whose probability reaches its threshold",
        }

    def probabilities(self, outputs: Array) -> Array:
        if not self.logits:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs.float().sigmoid()
        return 1.0 / (1.0 + np.exp(-outputs.astype(np.float64)))

    def labels(self, probs: np.ndarray) -> list[str]:
        return [name for name, p, t in zip(self.names, probs, self.thresholds, strict=True) if p >= t]

    def csv_header(self) -> list[str]:
        return ["labels", *(f"p_{name}" for name in self.names)]

    def csv_row(self, probs: np.ndarray) -> list[Any]:
        return [" ".join(self.labels(probs)), *(f"{p:.6f}" for p in probs)]

    def answer(self, probs: np.ndarray, top_k: int = 1) -> dict[str, Any]:
        return {
            "labels": self.labels(probs),
            "probabilities": {name: float(p) for name, p in zip(self.names, probs, strict=True)},
        }

    def describe(self) -> dict[str, Any]:
        return {"kind": "tags", "thresholds": dict(zip(self.names, self.thresholds, strict=True))}

    def reduce(self, outputs: np.ndarray) -> np.ndarray:
        return np.asarray(self.probabilities(outputs), dtype=np.float32)

    def score(self, reduced: np.ndarray, targets: np.ndarray) -> float:
        """Macro mAP over the tags, exact (not binned)."""
        from torchmetrics.functional.classification import multilabel_average_precision

        probs, labels = torch.from_numpy(reduced), torch.from_numpy(targets).long()
        return float(multilabel_average_precision(probs, labels, len(self.names), average="macro"))

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        """The fraction of images given exactly the same tag set."""
        limits = np.asarray(self.thresholds, dtype=np.float32)
        return float(((reduced >= limits) == (reference >= limits)).all(axis=1).mean())


#: The decoder of each kind of target the tasks record (`output_spec()["kind"]`; absent: one class per image).
DECODERS: dict[str, Any] = {"class": OneClass, "tags": Tags, "values": Values}


def decoder_for(spec: Mapping[str, Any] | None, names: Sequence[str]) -> Decoder:
    """The decoder of a checkpoint's or export's task record; `names` when the record lists none."""
    spec = spec or {}
    kind = spec.get("kind", "class")
    if kind not in DECODERS:
        raise UserError(f"the model's outputs are of kind {kind!r}, which this version cannot decode")
    return DECODERS[kind].from_spec(spec, list(spec.get("names") or names))


def deployed(
    net: nn.Module, spec: Mapping[str, Any] | None, names: Sequence[str]
) -> tuple[nn.Module, dict[str, Any], Decoder]:
    """(what an export of `net` holds, its task record, the decoder of its outputs) for a checkpoint's
    task record `spec`: a single-label network as it is, a multi-label one followed by its sigmoid."""
    exported = decoder_for(spec, names).exported(dict(spec or {}))
    return decoder_for(spec, names).deployable(net), exported, decoder_for(exported, names)
