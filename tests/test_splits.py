"""The validation split (project/data/splits.py): a stratified hold-out, and the stratified parts k-fold splits and
`prepare --num_folds` deal, each a pure function of the labels, the kind of target and the seed."""

from collections import Counter

import pytest
import torch

from project.data import ImageFolderDataModule
from project.data.splits import HoldOut, check_parts, stratified_parts
from project.data.targets import Classes
from project.errors import UserError
from tests.folder_fits import tiny_folder

LABELS = [0] * 7 + [1] * 12 + [2] * 5 + [1] * 3  # uneven classes, not sorted
KIND = Classes(("a", "b", "c"))


def parts(labels: list[int], count: int, seed: int) -> list[list[int]]:
    return stratified_parts(labels, count, seed, Classes(tuple(str(c) for c in range(max(labels) + 1))))


def test_parts_are_disjoint_stratified_and_cover_every_index_once():
    folds = parts(LABELS, 3, seed=0)
    every = [i for f in folds for i in f]
    assert sorted(every) == list(range(len(LABELS)))  # each index in exactly one part
    counts = Counter(LABELS)
    for fold in folds:
        per_class = Counter(LABELS[i] for i in fold)
        for c, n in counts.items():
            assert per_class[c] in (n // 3, -(-n // 3)), (c, per_class)
    assert max(map(len, folds)) - min(map(len, folds)) <= 1


def test_parts_are_a_pure_function_of_labels_count_and_seed():
    assert parts(LABELS, 3, seed=5) == parts(list(LABELS), 3, seed=5)
    assert parts(LABELS, 3, seed=5) != parts(LABELS, 3, seed=6)
    assert parts(LABELS, 3, seed=5) != parts(LABELS, 4, seed=5)


def _torch_folds(labels: list[int], num_folds: int, seed: int) -> list[list[int]]:
    """The folds as the first release dealt them, in torch ops: what a user's earlier runs were split by."""
    label_tensor, generator = torch.tensor(labels), torch.Generator().manual_seed(seed)
    folds: list[list[int]] = [[] for _ in range(num_folds)]
    start = 0
    for c in torch.unique(label_tensor, sorted=True).tolist():
        idx = (label_tensor == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=generator)].tolist()
        for i, index in enumerate(idx):
            folds[(start + i) % num_folds].append(index)
        start = (start + len(idx)) % num_folds
    return [sorted(f) for f in folds]


def test_a_seed_splits_the_data_as_earlier_releases_did(tmp_path):
    """Folds and the validation split are a user's record of what a model saw: a faster implementation must
    not move one image between them (a resumed cv study or a compared run would mix splits)."""
    labels = torch.randint(0, 7, (2000,), generator=torch.Generator().manual_seed(3)).tolist()
    for seed, k in ((0, 3), (5, 5), (42, 2)):
        assert parts(labels, k, seed) == _torch_folds(labels, k, seed)

    data = tiny_folder(tmp_path / "images", per_class=7)
    dm = ImageFolderDataModule(str(data), image_size=8, val_fraction=0.3, cache_dir=str(tmp_path / "c"))
    labels = dm.scanned("train").labels
    g, label_tensor, expected = torch.Generator().manual_seed(dm.seed), torch.tensor(labels), ([], [])
    for c in range(len(dm.class_names)):
        idx = (label_tensor == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)].tolist()
        n_val = min(len(idx) - 1, max(1, round(0.3 * len(idx))))
        expected[1].extend(idx[:n_val])
        expected[0].extend(idx[n_val:])
    assert dm._split() == (sorted(expected[0]), sorted(expected[1]))
    assert (
        HoldOut(0.3).split(labels, dm.seed, dm.targets) == dm._split()
    )  # the default split, held as an object


def test_a_split_given_with_a_validation_folder_is_refused_saying_what_to_do(tmp_path):
    data = tiny_folder(tmp_path / "images", per_class=4, test=True)
    tiny_folder(data / "val", per_class=2)
    dm = ImageFolderDataModule(str(data), image_size=8, split=HoldOut(0.5), cache_dir=str(tmp_path / "c"))
    with pytest.raises(
        UserError, match=r"data.split HoldOut\(0.5\) with the validation folder .*/val: .*Move its"
    ):
        dm.class_names  # noqa: B018  # the first scan


def test_too_few_images_for_the_parts_name_the_class_and_the_setting():
    with pytest.raises(UserError, match="class 'c' has 1 image.*fewer than data.split.num_folds=2"):
        check_parts([0, 0, 1, 1, 2], 2, KIND, "data.split.num_folds")
    check_parts([0, 1, 2, 0, 1, 2], 2, KIND, "--num_folds")
