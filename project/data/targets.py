"""Kinds of target: what one image's label is, and everything that follows from it.

A source says the kind of its labels (a DataModule's `targets`), a task the kinds it accepts (`ImageTask.accepts`),
and everything else asks the kind: how labels are encoded (`encode`) and stored by `prepare` (`stored`), what
stratifies validation splits and folds (`strata`, or `deal`), what MixUp interpolates (`mixable`), the metric a task
monitors and how a split is scored (`metric`, `score`, `per_name`), the outputs a network needs (`outputs`), what a
checkpoint records of them (`output_spec`) and how deployment and the dashboard read them (`decoder`,
`dashboard_panels`). `Classes` is the core's; a part adds a kind by registering it (`target_kinds`: project.registry).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: One image's label: its class index; the indices of its tags (maybe none); or its real values.
Label = int | tuple[int, ...] | tuple[float, ...]
Array = TypeVar("Array", np.ndarray, Tensor)


@dataclass(frozen=True)
class TargetKind:
    """What the kinds share: the names of the outputs (classes, tags, values) in order."""

    names: tuple[str, ...]
    #: The kind's name, as checkpoints (`data_identity`) and prepared datasets record it.
    kind: ClassVar[str]
    #: What one name is (`class`, `tag`, `value`) and what a target is, in messages.
    noun: ClassVar[str]
    described: ClassVar[str]
    #: The validation metric a task of this kind monitors (`val/<metric>`) and whether higher is better.
    metric: ClassVar[str]
    mode: ClassVar[Literal["min", "max"]]
    #: Each name's figure in cv's report (`per_name`), as a metric and in words.
    per_name_metric: ClassVar[str]
    per_name_words: ClassVar[str]

    @classmethod
    def example(cls) -> tuple["TargetKind", list[Any]]:
        """The kind over a few names, and 20 images' labels: what the contract suite checks it on."""
        raise NotImplementedError

    @property
    def outputs(self) -> int:
        """The network outputs the kind implies: one per name."""
        return len(self.names)

    def encode(self, labels: Sequence[Any]) -> Tensor:
        """The training targets of `labels`."""
        raise NotImplementedError

    def stored(self, label: Any) -> Any:
        """A label as `prepare` stores it (streaming reads it back as the target `encode` makes)."""
        raise NotImplementedError

    def counts(self, labels: Sequence[Any]) -> list[int] | None:
        """Images per name; None where names do not group images (values)."""
        return None

    def strata(self, labels: Sequence[Any]) -> list[int] | None:
        """Each image's stratum for splits and folds; None: the kind deals its images itself (`deal`)."""
        raise NotImplementedError

    def deal(self, labels: Sequence[Any], proportions: Sequence[float], seed: int) -> list[list[int]]:
        """The images dealt into parts of `proportions` (summing to 1), for a kind without strata."""
        raise NotImplementedError

    def mixable(self, targets: Tensor) -> Tensor:
        """The float rows MixUp/CutMix interpolate between two images."""
        return targets.float()

    def score(self, outputs: Tensor, targets: Tensor) -> float:
        """The headline figure (`metric`) of a split from what a task makes of its outputs (`probabilities`)."""
        raise NotImplementedError

    def per_name(self, outputs: Tensor, targets: Tensor) -> dict[str, float | None]:
        """Each name's figure (`per_name_metric`); None for a name the split has nothing of."""
        raise NotImplementedError

    def output_spec(self) -> dict[str, Any]:
        """What a checkpoint records of the outputs (its `task` entry, with `kind` unless one class per image)."""
        raise NotImplementedError

    def decoder(self, spec: Mapping[str, Any]) -> Any:
        """How export and serving read the outputs a task record `spec` describes (see `OneClass`)."""
        raise NotImplementedError

    def dashboard_panels(self, worst_k: int) -> Any:
        """The W&B panels of a validation of this kind (see the tags' `TagPanels`); None: those of classes."""
        return None


@dataclass(frozen=True)
class Classes(TargetKind):
    """One class per image: int64 class indices (N,); MixUp mixes one-hot rows."""

    kind: ClassVar[str] = "classes"
    noun: ClassVar[str] = "class"
    described: ClassVar[str] = "one class per image"
    metric: ClassVar[str] = "acc"
    mode: ClassVar[Literal["min", "max"]] = "max"
    per_name_metric: ClassVar[str] = "acc"
    per_name_words: ClassVar[str] = "accuracy"

    @classmethod
    def example(cls) -> tuple["Classes", list[Any]]:
        return cls(("cat", "dog", "fox")), [i % 3 for i in range(20)]

    def encode(self, labels: Sequence[Any]) -> Tensor:
        return torch.as_tensor(labels, dtype=torch.long)

    def stored(self, label: Any) -> Any:
        return int(label)

    def counts(self, labels: Sequence[Any]) -> list[int] | None:
        return np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(self.names)).tolist()

    def strata(self, labels: Sequence[Any]) -> list[int] | None:
        return list(labels)

    def mixable(self, targets: Tensor) -> Tensor:
        return F.one_hot(targets, len(self.names)).float()

    def score(self, outputs: Tensor, targets: Tensor) -> float:
        """Top-1 accuracy."""
        return float((outputs.argmax(1) == targets).double().mean())

    def per_name(self, outputs: Tensor, targets: Tensor) -> dict[str, float | None]:
        correct = outputs.argmax(1) == targets
        return {
            name: float(correct[targets == c].double().mean()) if bool((targets == c).any()) else None
            for c, name in enumerate(self.names)
        }

    def output_spec(self) -> dict[str, Any]:
        return {"outputs": "logits", "decode": "softmax, then the most probable class"}

    def decoder(self, spec: Mapping[str, Any]) -> "OneClass":
        return OneClass(self.names, spec.get("outputs", "logits") == "logits")


@dataclass(frozen=True)
class OneClass:
    """How deployment (export, serving) reads a classifier's outputs (`TargetKind.decoder`): softmax, then the
    most probable class; `logits` false: they are probabilities already."""

    names: tuple[str, ...]
    logits: bool = True
    quality: ClassVar[str] = "accuracy"
    agrees: ClassVar[str] = "top-1 agrees with FP32"
    quality_note: ClassVar[str] = "Accuracy: top-1"
    output_name: ClassVar[str] = "logits"

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


def kind_named(name: str, names: Sequence[str]) -> TargetKind:
    """The kind recorded as `name` (a checkpoint's or a prepared dataset's), over `names`: one that a package
    present registers (project.registry)."""
    from project.registry import load, registered

    if name not in registered("target_kinds"):
        known = ", ".join(registered("target_kinds"))
        raise ValueError(f"unknown kind of target {name!r}; known: {known}")
    return load("target_kinds", name)(tuple(names))
