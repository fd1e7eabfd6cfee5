"""`Tags`: any number of tags per image, none included, and everything that follows from it: float32 multi-hot
targets, splits and folds dealt by iterative stratification, macro mean average precision, the decoding of a
sigmoid per tag for export and serving, the W&B panels of a validation, and how a CSV writes an image's tags."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from project.data.label_checks import data_warning, shown
from project.data.targets import TargetKind
from project.errors import UserError

Array = TypeVar("Array", np.ndarray, Tensor)

#: The cells of a CSV's 0/1 columns (`data.label_columns`) that say an image has, or has not, the column's tag.
ONE, ZERO = {"1", "1.0"}, {"0", "0.0"}
#: Characters that often separate tags: one inside a tag suggests the tags were split at the wrong one.
TAG_SEPARATORS = ",;|"
#: Points of each tag's precision-recall curve on the dashboard (thresholds 0, 1/(n-1), ..., 1).
CURVE_POINTS = 21


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

    @classmethod
    def example(cls) -> tuple["Tags", list[Any]]:
        return cls(("blue", "red", "round")), [tuple(t for t in range(3) if i >> t & 1) for i in range(20)]

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
        counts = np.zeros(len(self.names), dtype=np.int64)
        for tags in labels:
            counts[list(tags)] += 1
        return counts.tolist()

    def strata(self, labels: Sequence[Any]) -> list[int] | None:
        return None  # an image counts towards each of its tags: `deal` spreads every tag instead

    def deal(self, labels: Sequence[Any], proportions: Sequence[float], seed: int) -> list[list[int]]:
        return iterative_stratification(labels, proportions, seed)

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

    def decoder(self, spec: Mapping[str, Any]) -> "TagsDecoder":
        thresholds = tuple(float(t) for t in spec.get("thresholds") or [0.5] * len(self.names))
        if len(thresholds) != len(self.names):
            raise UserError(f"the task record has {len(thresholds)} thresholds for {len(self.names)} tags")
        return TagsDecoder(self.names, thresholds, spec.get("outputs", "logits") == "logits")

    def dashboard_panels(self, worst_k: int) -> "TagPanels":
        return TagPanels()

    # -- an image's tags as a CSV writes them (a CSV source reads its label cells through these) ---------------
    @classmethod
    def read_cells(
        cls,
        cells: list[str],
        columns: list[str],
        per_name: bool,
        separator: str | None,
        named: Callable[[str], str],
    ) -> tuple[str, ...]:
        """An image's tags: those of its one cell, split at `separator` (None: whitespace), or with `per_name` the
        `columns` whose cell is 1; a ValueError saying why a 0/1 cell is neither."""
        if not per_name:
            return tuple(sorted({named(tag.strip()) for tag in cells[0].split(separator) if tag.strip()}))
        for name, cell in zip(columns, cells, strict=True):
            if cell not in ONE | ZERO:
                raise ValueError(f"column {name!r} holds {shown(cell)}; label_columns hold 0 or 1")
        return tuple(name for name, cell in zip(columns, cells, strict=True) if cell in ONE)

    @classmethod
    def names_read(
        cls, labels: list[Any], rows: list[int], columns: list[str], per_name: bool, separator: str | None,
        where: str,
    ) -> list[str]:  # fmt: skip
        """The tags of the training CSV `where`: its `columns` (per_name), or every tag it writes, sorted; a
        UserError for fewer than two, a warning for tags that hold a character that often separates tags."""
        if per_name:
            if len(columns) < 2:
                raise UserError(
                    f"data.label_columns names {len(columns)} column(s) ({', '.join(columns)}): a multi-label model "
                    "needs at least two tags, one 0/1 column each; for one tag, give each image one of two labels"
                )
            return list(columns)
        names = {tag for tags in labels for tag in tags}
        if len(names) < 2:
            which = "no row has a tag" if not names else f"every tag is {shown(next(iter(names)))}"
            raise UserError(
                f"{where}: {which} in column {columns[0]!r}: a multi-label model needs at least two tags; for one "
                "tag, give each image one of two labels (has it, or not)"
            )
        marks = [c for c in TAG_SEPARATORS if c != separator]
        if odd := sorted(tag for tag in names if any(c in tag for c in marks)):
            mark = next(c for c in marks if c in odd[0])
            row = next(row for row, tags in zip(rows, labels, strict=True) if odd[0] in tags)
            more = f" (and {len(odd) - 1} more tag(s) like it)" if len(odd) > 1 else ""
            data_warning(
                f"tag {shown(odd[0])} of {where} (row {row}) holds {mark!r}, and tags are split at "
                f"{'whitespace' if separator is None else repr(separator)} (data.label_separator){more}: if {mark!r} "
                f"separates the tags, set --data.label_separator '{mark}'"
            )
        return sorted(names)

    @staticmethod
    def indexed(label: tuple[str, ...], index: dict[str, int]) -> tuple[int, ...]:
        """An image's tags as indices of the names; a KeyError naming a tag outside `index`."""
        return tuple(index[tag] for tag in label)


def iterative_stratification(
    tag_sets: Sequence[Sequence[int]], proportions: Sequence[float], seed: int
) -> list[list[int]]:
    """Multi-label images dealt into parts of the given `proportions` (summing to 1) so that every tag's images
    are shared out in those proportions as nearly as possible (Sechidis, Tsoumakas and Vlahavas, "On the
    stratification of multi-label data", 2011). Returns each part's indices, sorted.

    The rarest tag first (counting only images not yet placed), because rare tags are the hardest to spread:
    each of its images goes to the part that still wants most of that tag, then the one that wants most images;
    an image placed counts towards all its tags. Images with no tag fill the parts' remaining sizes. Images are
    taken in an order shuffled by `seed`; ties go to the lower part.
    """
    order = torch.randperm(len(tag_sets), generator=torch.Generator().manual_seed(seed)).tolist()
    parts: list[list[int]] = [[] for _ in proportions]
    wanted = [p * len(tag_sets) for p in proportions]  # images each part still wants
    images_with: dict[int, list[int]] = {}
    for i in order:
        for tag in tag_sets[i]:
            images_with.setdefault(tag, []).append(i)
    wanted_tag = {tag: [p * len(ix) for p in proportions] for tag, ix in images_with.items()}
    unplaced = {tag: len(ix) for tag, ix in images_with.items()}
    placed = [False] * len(tag_sets)

    def place(i: int, part: int) -> None:
        placed[i] = True
        parts[part].append(i)
        wanted[part] -= 1
        for tag in tag_sets[i]:
            wanted_tag[tag][part] -= 1
            unplaced[tag] -= 1

    while unplaced := {tag: n for tag, n in unplaced.items() if n > 0}:
        rarest = min(unplaced, key=lambda tag: (unplaced[tag], tag))
        for i in images_with[rarest]:
            if not placed[i]:
                place(i, max(range(len(parts)), key=lambda k: (wanted_tag[rarest][k], wanted[k])))
    for i in order:  # the images with no tag
        if not placed[i]:
            place(i, max(range(len(parts)), key=lambda k: wanted[k]))
    return [sorted(p) for p in parts]


@dataclass(frozen=True)
class TagsDecoder:
    """How export, predict_onnx, serve and quantize read a multi-label model: a sigmoid per tag, then every tag
    whose probability reaches its threshold. An export writes the network followed by its sigmoid, so its
    outputs are probabilities."""

    names: tuple[str, ...]
    thresholds: tuple[float, ...]
    logits: bool = True
    quality: ClassVar[str] = "mAP"
    agrees: ClassVar[str] = "tag sets agree with FP32"
    quality_note: ClassVar[str] = (
        "mAP (macro mean average precision over the tags; agreement: the same tag set at the thresholds)"
    )
    output_name: ClassVar[str] = "probabilities"

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
        return Tags(self.names).score(torch.from_numpy(reduced), torch.from_numpy(targets))

    def agreement(self, reduced: np.ndarray, reference: np.ndarray) -> float:
        """The fraction of images given exactly the same tag set."""
        limits = np.asarray(self.thresholds, dtype=np.float32)
        return float(((reduced >= limits) == (reference >= limits)).all(axis=1).mean())


@dataclass
class TagPanels:
    """The W&B dashboard of a multi-label validation: each tag's average precision (bars, `val/ap_per_tag`) and
    precision-recall curve (lines, `val/pr_curve`), over the whole validation set and all processes."""

    metrics: Any = field(default=None)

    def reset(self) -> None:
        if self.metrics is not None:
            self.metrics.reset()

    def update(self, logits: Tensor, targets: Tensor, images: Tensor, pl_module: Any, pictures: Any) -> None:
        if self.metrics is None:
            from torchmetrics import MetricCollection
            from torchmetrics.classification import MultilabelAveragePrecision, MultilabelPrecisionRecallCurve

            bins, tags = torch.linspace(0, 1, CURVE_POINTS), logits.shape[1]
            self.metrics = MetricCollection(
                {
                    "ap": MultilabelAveragePrecision(tags, average=None, thresholds=bins),
                    "curve": MultilabelPrecisionRecallCurve(tags, thresholds=bins),
                },
                compute_groups=False,
            ).to(logits.device)
        self.metrics.update(logits.sigmoid(), targets.long())

    def charts(self, names: list[str], epoch: int, first: bool) -> dict[str, Any]:
        """Computed on every process (the states are summed); the charts, on the `first` one."""
        if self.metrics is None or not self.metrics["ap"].update_called:
            return {}
        tags = self.metrics.compute()
        if not first:
            return {}
        import wandb

        ap = tags["ap"].cpu()
        precision, recall, _ = (t.cpu() for t in tags["curve"])
        names = names if len(names) == len(ap) else [str(i) for i in range(len(ap))]
        bars = wandb.Table(
            columns=["tag", "AP"], data=[[n, float(v)] for n, v in zip(names, ap, strict=True)]
        )
        points = [
            [names[i], float(r), float(p)]
            for i in range(len(names))
            for p, r in zip(precision[i], recall[i], strict=True)
            if not (p.isnan() or r.isnan())  # a tag without positives has no curve
        ]
        curves = wandb.Table(columns=["tag", "recall", "precision"], data=points)
        return {
            "val/ap_per_tag": wandb.plot.bar(
                bars, "tag", "AP", title=f"Validation AP per tag, epoch {epoch}"
            ),
            "val/pr_curve": wandb.plot.line(
                curves,
                "recall",
                "precision",
                stroke="tag",
                title=f"Validation precision-recall, epoch {epoch}",
            ),
        }
