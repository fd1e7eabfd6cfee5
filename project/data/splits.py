"""How a DataModule's training images divide into the part that trains and the part that validates.

A pure function of the labels, the kind of target and the seed: nothing else goes in (no rank, no time), so every
rerun and every DDP process divides alike. A DataModule whose data has no validation split holds a
`ValidationSplit` (`data.split`; by default a stratified hold-out of `val_fraction`); a part adds others by
registering them (`splits`: project.registry). What stratifies is the kind's (`TargetKind.strata`, or `deal`).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from project.data.targets import TargetKind
from project.errors import UserError


class ValidationSplit:
    """The seam: which of a training split's images validate."""

    def check(self, labels: Sequence[Any], targets: TargetKind) -> None:
        """A UserError for labels this split cannot divide, when they are first read (before anything trains)."""

    def split(self, labels: Sequence[Any], seed: int, targets: TargetKind) -> tuple[list[int], list[int]]:
        """(train indices, validation indices) of `labels`, of the kind `targets`, dealt by `seed`."""
        raise NotImplementedError

    def stored_rows(self, sizes: Sequence[int] | None, where: str) -> tuple[list[int], list[int]]:
        """(training rows, validation rows) of a training split stored in parts of `sizes` one after another
        (`prepare --num_folds`; None: stored as one), which `where` holds."""
        raise UserError(f"data.split {self!r} cannot divide the training split stored in {where}")


class HoldOut(ValidationSplit):
    """`fraction` of each stratum (a class, a bin of values) validates: at least one image, never all of it."""

    def __init__(self, fraction: float = 0.1) -> None:
        self.fraction = fraction

    def __repr__(self) -> str:
        return f"HoldOut({self.fraction})"

    def split(self, labels: Sequence[Any], seed: int, targets: TargetKind) -> tuple[list[int], list[int]]:
        strata = targets.strata(labels)
        if strata is None:  # the kind deals its images itself (tag sets)
            train, val = targets.deal(labels, [1 - self.fraction, self.fraction], seed)
        else:
            train, val = self._strata_split(strata, seed)
        if not val:
            noun = targets.noun
            why, change = (
                (
                    f" and a {noun} with one image keeps it for training",
                    f"give every {noun} two images or more",
                )
                if strata is not None and targets.counts(labels) is not None
                else ("", "raise data.val_fraction")
            )
            raise UserError(
                f"data.val_fraction={self.fraction} leaves no image to validate on: the training split has "
                f"{len(labels)} image(s){why}. Add images ({change}), or give the data a validation split of its own"
            )
        return train, val

    def _strata_split(self, strata: list[int], seed: int) -> tuple[list[int], list[int]]:
        g = torch.Generator().manual_seed(seed)
        label_array = np.asarray(strata)  # numpy's masks: torch.nonzero is far slower on CPU
        train_idx, val_idx = [], []
        for c in range(max(strata, default=-1) + 1):
            idx = np.flatnonzero(label_array == c)
            idx = idx[torch.randperm(len(idx), generator=g).numpy()].tolist()
            n_val = min(len(idx) - 1, max(1, round(self.fraction * len(idx)))) if len(idx) > 1 else 0
            val_idx += idx[:n_val]
            train_idx += idx[n_val:]
        return sorted(train_idx), sorted(val_idx)


def stratified_parts(labels: Sequence[Any], count: int, seed: int, targets: TargetKind) -> list[list[int]]:
    """The indices of each of `count` equal parts of `labels` (k-fold's folds, `prepare`'s stored parts), each
    sorted: every stratum's images, shuffled by `seed`, dealt round-robin, each stratum starting where the last
    one stopped, so a part holds the floor or the ceiling of each stratum's share and sizes differ by one at most."""
    strata = targets.strata(labels)
    if strata is None:
        return targets.deal(labels, [1 / count] * count, seed)
    label_array = np.asarray(strata, dtype=np.int64)
    generator = torch.Generator().manual_seed(seed)
    parts: list[list[int]] = [[] for _ in range(count)]
    start = 0
    for c in np.unique(label_array).tolist():
        idx = np.flatnonzero(label_array == c)
        idx = idx[torch.randperm(len(idx), generator=generator).numpy()].tolist()
        for i, index in enumerate(idx):
            parts[(start + i) % count].append(index)
        start = (start + len(idx)) % count
    return [sorted(p) for p in parts]


def check_parts(labels: Sequence[Any], count: int, targets: TargetKind, key: str) -> None:
    """A UserError naming the first class (or tag) with fewer images than `count` parts (each needs one of every
    class, each multi-label part one image with every tag), or, for values, fewer images than parts; `key` is the
    setting that asks for them."""
    counts = targets.counts(labels)
    if counts is None:
        if len(labels) < count:
            raise UserError(
                f"the training split has {len(labels)} image(s), fewer than {key}={count}: every fold needs at "
                "least one; add images or choose fewer folds"
            )
        return
    noun = targets.noun
    for name, n in zip(targets.names, counts, strict=True):
        if n < count:
            raise UserError(
                f"{noun} {name!r} has {n} image(s), fewer than {key}={count}: every fold needs at least one "
                f"image of every {noun}; add images or choose fewer folds"
            )
