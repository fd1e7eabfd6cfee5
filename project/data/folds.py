"""Stratified k-fold splits: a pure function of the labels, the number of folds and the seed.

Nothing else goes in (no rank, no time, no file order beyond the labels' own order), so every rerun and every
DDP process computes the same folds. What stratifies them is the kind of target's (`project.data.targets`):
classes are stratified per class and real values per quantile bin (`stratified_folds`); tag sets, where one
image counts towards several tags, by iterative stratification (`iterative_stratification`), which also makes
multi-label validation splits.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from project.data.targets import TargetKind
from project.errors import UserError


def check_fold_args(num_folds: int | None, fold: int) -> None:
    """A UserError naming `data.num_folds` or `data.fold` when they do not describe a fold."""
    if num_folds is None:
        if fold != 0:
            raise UserError(f"data.fold={fold} needs data.num_folds (the number of folds it is one of)")
        return
    if num_folds < 2:
        raise UserError(f"data.num_folds must be at least 2, got {num_folds}")
    if not 0 <= fold < num_folds:
        raise UserError(f"data.fold={fold} is outside [0, {num_folds}) (data.num_folds={num_folds})")


def check_class_counts(labels: Sequence[Any], num_folds: int, targets: TargetKind) -> None:
    """A UserError naming the first class (or tag) with fewer images than folds (each fold needs one of every
    class, and each multi-label fold one image with every tag), or, for values, fewer images than folds."""
    counts = targets.counts(labels)
    if counts is None:
        if len(labels) < num_folds:
            raise UserError(
                f"the training split has {len(labels)} image(s), fewer than data.num_folds={num_folds}: every "
                "fold needs at least one; add images or choose fewer folds"
            )
        return
    kind, on = targets.noun, "is on" if targets.kind == "tags" else "has"  # an image has one class, many tags
    for name, count in zip(targets.names, counts, strict=True):
        if count < num_folds:
            raise UserError(
                f"{kind} {name!r} {on} {count} image(s), fewer than data.num_folds={num_folds}: every fold needs "
                f"at least one image of every {kind}; add images or choose fewer folds"
            )


def stratified_folds(labels: Sequence[int], num_folds: int, seed: int) -> list[list[int]]:
    """The indices of each of `num_folds` folds, each sorted; together they cover every index exactly once.

    Each class's indices are shuffled by a generator seeded with `seed` and dealt round-robin into the
    folds, each class starting where the previous one stopped: every fold holds the floor or the ceiling of
    each class's share, and the folds' sizes differ by at most one.
    """
    label_array = np.asarray(labels, dtype=np.int64)  # numpy's masks: torch.nonzero is far slower on CPU
    generator = torch.Generator().manual_seed(seed)
    folds: list[list[int]] = [[] for _ in range(num_folds)]
    start = 0
    for c in np.unique(label_array).tolist():
        idx = np.flatnonzero(label_array == c)
        idx = idx[torch.randperm(len(idx), generator=generator).numpy()].tolist()
        for i, index in enumerate(idx):
            folds[(start + i) % num_folds].append(index)
        start = (start + len(idx)) % num_folds
    return [sorted(f) for f in folds]


def make_folds(
    labels: Sequence[Any], num_folds: int, seed: int, targets: TargetKind | None = None
) -> list[list[int]]:
    """The indices of each fold of `labels`, of the kind `targets` (default: class indices), which says what
    stratifies them (`TargetKind.strata`; none: tag sets, dealt by iterative stratification)."""
    strata = list(labels) if targets is None else targets.strata(labels)
    if strata is None:
        assert targets is not None  # (class indices are their own strata)
        return targets.deal(labels, [1 / num_folds] * num_folds, seed)
    return stratified_folds(strata, num_folds, seed)


def fold_split(
    labels: Sequence[Any], num_folds: int, fold: int, seed: int, targets: TargetKind | None = None
) -> tuple[list[int], list[int]]:
    """(train indices, validation indices): fold `fold` of `make_folds` validates, the other folds train."""
    folds = make_folds(labels, num_folds, seed, targets)
    train = sorted(i for k, f in enumerate(folds) if k != fold for i in f)
    return train, folds[fold]


@dataclass(frozen=True)
class Folds:
    """Cross-validation's split of a training split: `count` stratified folds, of which fold `fold` validates
    and the others train. A DataModule that can be cross-validated holds one (`folds`, made from its
    `num_folds` and `fold` settings by `Folds.of`; None without them) and asks it for its two parts.

    Folds computed from the labels (`split`) are stratified by the kind of target, as `make_folds` says;
    folds a tool stored one after another (`prepare --num_folds`) are read back as ranges (`stored_rows`).
    """

    count: int
    fold: int = 0

    def __post_init__(self) -> None:
        check_fold_args(self.count, self.fold)

    @staticmethod
    def of(num_folds: int | None, fold: int) -> "Folds | None":
        """The folds `data.num_folds` and `data.fold` describe; None without num_folds (a UserError for a
        fold given without it, or one outside the folds)."""
        check_fold_args(num_folds, fold)
        return None if num_folds is None else Folds(num_folds, fold)

    def check(self, labels: Sequence[Any], targets: TargetKind) -> None:
        """A UserError when a class (or tag) has fewer images than folds: checked when the labels are first
        read, before anything trains."""
        check_class_counts(labels, self.count, targets)

    def split(self, labels: Sequence[Any], seed: int, targets: TargetKind) -> tuple[list[int], list[int]]:
        """(train indices, validation indices) of `labels` (of the kind `targets`), dealt by `seed`."""
        self.check(labels, targets)
        return fold_split(labels, self.count, self.fold, seed, targets)

    def stored_rows(self, sizes: Sequence[int]) -> tuple[list[int], list[int]]:
        """(training rows, validation rows) of a split stored fold after fold, the folds `sizes` long: each
        fold is one range of rows."""
        start = sum(sizes[: self.fold])
        end = start + sizes[self.fold]
        return [*range(start), *range(end, sum(sizes))], list(range(start, end))
