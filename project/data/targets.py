"""Kinds of target: what one image's label is, and everything that follows from that.

A source says the kind of its labels (a DataModule's `targets`); a task says the kinds it accepts
(`ImageTask.accepts`). Everything else that used to ask "is it multi-label?" asks the kind instead:

- how labels are encoded for training (`encode`: int64 class indices, float32 multi-hot rows, float32 values)
  and stored by `prepare` (`stored`);
- what stratifies validation splits and folds (`strata`: the class; a value's quantile bin; for tags none, so
  tag sets are dealt by iterative stratification) and what each name counts (`counts`, for the label checks);
- how MixUp/CutMix mix two targets (`mixable`: the rows that are interpolated);
- the headline metric a task monitors (`metric`, `mode`) and how a split is scored from its outputs (`score`,
  `per_name`: cv's evaluation and its report);
- how many network outputs the kind implies (`outputs`) and what a checkpoint records for deployment
  (`output_spec`, read by `project.export.decoding`) and for its data's identity (`kind`).

A new kind is one class, registered by its package (`target_kinds`: project.registry), and a task that accepts it.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

#: One image's label: its class index; the indices of its tags (maybe none); or its real values.
Label = int | tuple[int, ...] | tuple[float, ...]

#: At most this many quantile bins stratify a split of real values, and at least this many images fill one.
VALUE_BINS, IMAGES_PER_BIN = 10, 5


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
        """Each image's stratum for splits and folds; None: deal tag sets by iterative stratification."""
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
        """What a checkpoint records of the outputs, for export and serving (`project.export.decoding`)."""
        raise NotImplementedError


def _count(labels: Sequence[Any], names: int, each: bool) -> list[int]:
    counts = np.zeros(names, dtype=np.int64)
    if each:
        for tags in labels:
            counts[list(tags)] += 1
    elif len(labels):
        counts += np.bincount(np.asarray(labels, dtype=np.int64), minlength=names)
    return counts.tolist()


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

    def encode(self, labels: Sequence[Any]) -> Tensor:
        return torch.as_tensor(labels, dtype=torch.long)

    def stored(self, label: Any) -> Any:
        return int(label)

    def counts(self, labels: Sequence[Any]) -> list[int] | None:
        return _count(labels, len(self.names), each=False)

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


@dataclass(frozen=True)
class Tags(TargetKind):
    """Any number of tags per image: float32 multi-hot rows (N, tags); MixUp mixes the rows."""

    kind: ClassVar[str] = "tags"
    noun: ClassVar[str] = "tag"
    described: ClassVar[str] = "a set of tags per image"
    metric: ClassVar[str] = "map"
    mode: ClassVar[Literal["min", "max"]] = "max"
    per_name_metric: ClassVar[str] = "ap"
    per_name_words: ClassVar[str] = "average precision"

    def encode(self, labels: Sequence[Any]) -> Tensor:
        targets = torch.zeros(len(labels), len(self.names), dtype=torch.float32)
        for row, tags in enumerate(labels):
            targets[row, list(tags)] = 1.0
        return targets

    def stored(self, label: Any) -> Any:
        row = np.zeros(len(self.names), dtype=np.uint8)
        row[list(label)] = 1
        return row

    def counts(self, labels: Sequence[Any]) -> list[int] | None:
        return _count(labels, len(self.names), each=True)

    def strata(self, labels: Sequence[Any]) -> list[int] | None:
        return None

    def score(self, outputs: Tensor, targets: Tensor) -> float:
        """Macro mean average precision over the tags (exact, not binned)."""
        from torchmetrics.functional.classification import multilabel_average_precision

        return float(multilabel_average_precision(outputs, targets.long(), len(self.names), average="macro"))

    def per_name(self, outputs: Tensor, targets: Tensor) -> dict[str, float | None]:
        from torchmetrics.functional.classification import multilabel_average_precision

        ap = multilabel_average_precision(outputs, targets.long(), len(self.names), average=None)
        present = targets.sum(0) > 0
        return {name: float(ap[i]) if bool(present[i]) else None for i, name in enumerate(self.names)}

    def output_spec(self) -> dict[str, Any]:
        return {
            "kind": "tags",
            "outputs": "logits",
            "decode": "sigmoid, then every tag whose probability reaches its threshold",
        }


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

    @staticmethod
    def read(cell: str) -> float:
        """A label cell as a real value; a ValueError saying why for text that is not a finite number."""
        if not cell.strip():
            raise ValueError("is empty")
        try:
            value = float(cell)
        except ValueError:
            raise ValueError("is not a number") from None
        if not np.isfinite(value):
            raise ValueError("is not a finite number")
        return value

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


def kind_named(name: str, names: Sequence[str]) -> TargetKind:
    """The kind recorded as `name` (a checkpoint's or a prepared dataset's), over `names`: one that a package
    present registers (project.registry)."""
    from project.registry import load, registered

    if name not in registered("target_kinds"):
        known = ", ".join(registered("target_kinds"))
        raise ValueError(f"unknown kind of target {name!r}; known: {known}")
    return load("target_kinds", name)(tuple(names))
