"""`KFold`: cross-validation's split of a training split, the validation split `cv` gives each fold's fit."""

from collections.abc import Sequence
from typing import Any

from project.data.splits import ValidationSplit, check_parts, stratified_parts
from project.data.targets import TargetKind
from project.errors import UserError


class KFold(ValidationSplit):
    """The training images dealt into `num_folds` stratified folds (by the kind of target, seeded by data.seed):
    fold `fold` validates, the others train. Folds stored by `prepare --num_folds` are read back as ranges.

    Args:
        num_folds: The number of folds (at least 2).
        fold: The fold that validates (0 to num_folds - 1).
    """

    def __init__(self, num_folds: int = 5, fold: int = 0) -> None:
        if num_folds < 2:
            raise UserError(f"data.split.num_folds must be at least 2, got {num_folds}")
        if not 0 <= fold < num_folds:
            raise UserError(
                f"data.split.fold={fold} is outside [0, {num_folds}) (data.split.num_folds={num_folds})"
            )
        self.num_folds, self.fold = num_folds, fold

    def __repr__(self) -> str:
        return f"KFold(num_folds={self.num_folds}, fold={self.fold})"

    def check(self, labels: Sequence[Any], targets: TargetKind) -> None:
        check_parts(labels, self.num_folds, targets, "data.split.num_folds")

    def split(self, labels: Sequence[Any], seed: int, targets: TargetKind) -> tuple[list[int], list[int]]:
        self.check(labels, targets)
        folds = stratified_parts(labels, self.num_folds, seed, targets)
        return sorted(i for k, f in enumerate(folds) if k != self.fold for i in f), folds[self.fold]

    def stored_rows(self, sizes: Sequence[int] | None, where: str) -> tuple[list[int], list[int]]:
        if sizes is None or len(sizes) != self.num_folds:
            recorded = f"with {len(sizes)} folds" if sizes else "without folds"
            raise UserError(
                f"data.split.num_folds={self.num_folds}: {where} was prepared {recorded}; prepare it again with "
                f"--num_folds {self.num_folds}, or set data.split.num_folds to the number recorded"
            )
        start = sum(sizes[: self.fold])
        end = start + sizes[self.fold]
        return [*range(start), *range(end, sum(sizes))], list(range(start, end))
