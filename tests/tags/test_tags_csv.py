"""Tags in a CSV (`data.kind tags`): one column of tags or a 0/1 column per tag, float multi-hot targets, validation
splits and folds by iterative stratification, and each bad CSV of tags one line."""

from pathlib import Path

import numpy as np
import pytest
import torch

from project.data.splits import stratified_parts
from project.errors import UserError
from project.tags.kind import Tags, iterative_stratification
from tests.csv.test_csv_data import TAGS, csv_dm, tagged, write_csv, write_images
from tests.csv.test_csv_label_checks import fit_args, labelled, warnings_of
from tests.test_bad_input import fails


@pytest.mark.parametrize("cache", [True, False])
def test_multilabel_targets_are_float_multi_hot_rows(tmp_path, cache):
    csv = tagged(tmp_path)
    by_tags = csv_dm(csv, tmp_path, label_column="tags", kind="tags", cache=cache)
    by_columns = csv_dm(csv, tmp_path, label_columns=TAGS, kind="tags", cache=cache)
    assert (
        isinstance(by_tags.targets, Tags)
        and isinstance(by_columns.targets, Tags)
        and by_tags.class_names == by_columns.class_names == TAGS
    )
    batches = []
    for dm in (by_tags, by_columns):
        dm.setup("fit")
        x, y = next(iter(dm.val_dataloader()))
        assert x.dtype == torch.uint8 and y.dtype == torch.float32 and y.shape == (len(x), 3)
        batches.append(y)
    assert torch.equal(*batches)
    # Each image's row is its tags: the CSV's 0/1 columns (images are named by their CSV row).
    rows = [line.split(",") for line in csv.read_text().splitlines()[1:]]
    expected = torch.tensor([[float(v) for v in row[2:]] for row in rows])
    assert not expected.sum(1).all()  # some images have no tag at all: valid
    val = by_tags.val_set
    if cache:
        files = [by_tags.train_files[i] for i in val.indices.tolist()]
        targets = val.targets[val.indices]
    else:
        files, targets = val.files, val.labels
    assert torch.equal(targets, expected[[int(Path(f).stem) for f in files]])


def test_multilabel_tags_are_sorted_separated_as_asked_and_checked_against_training(tmp_path):
    write_images(tmp_path / "img", 4)
    csv = write_csv(
        tmp_path / "t.csv", ["img/0.png,sky;dog", "img/1.png,", "img/2.png, cat ;sky", "img/3.png,dog"]
    )
    dm = csv_dm(csv, tmp_path, kind="tags", label_separator=";", val_fraction=0.25)
    assert dm.class_names == ["cat", "dog", "sky"] and dm.train_labels == [(1, 2), (), (0, 2), (1,)]
    val = write_csv(tmp_path / "v.csv", ["img/0.png,sky;bird"])
    with pytest.raises(UserError, match=r"v\.csv row 2: label 'bird'"):
        csv_dm(csv, tmp_path, kind="tags", label_separator=";", val_csv=str(val)).setup("fit")


def tag_sets(n: int, seed: int, tags: int = 5) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    rates = np.linspace(0.05, 0.6, tags)  # rare to common tags
    return [tuple(int(t) for t in np.flatnonzero(rng.random(tags) < rates)) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iterative_stratification_keeps_every_tags_share_in_every_fold(seed):
    labels = tag_sets(150, seed)
    folds = iterative_stratification(labels, [1 / 5] * 5, seed)
    assert sorted(i for f in folds for i in f) == list(range(150))
    assert any(not tags for tags in labels)  # images without tags are dealt out too
    for tag in range(5):
        total = sum(tag in tags for tags in labels)
        for fold in folds:
            assert abs(sum(tag in labels[i] for i in fold) - total / 5) <= 1, (tag, total)
    assert max(map(len, folds)) - min(map(len, folds)) <= 2
    assert folds == iterative_stratification(list(labels), [0.2] * 5, seed)  # a pure function of its inputs
    assert folds != iterative_stratification(labels, [0.2] * 5, seed + 10)
    assert stratified_parts(labels, 5, seed, Tags(tuple(map(str, range(5))))) == folds  # k-fold's, prepare's


def test_multilabel_validation_split_and_folds_follow_every_tag(tmp_path):
    csv = tagged(tmp_path, n=40)
    dm = csv_dm(csv, tmp_path, label_column="tags", kind="tags", val_fraction=0.25)
    dm.setup("fit")
    val = dm.val_set.targets[dm.val_set.indices]
    everything = dm.val_set.targets
    assert len(val) == 10
    assert ((val.sum(0) - everything.sum(0) * 0.25).abs() <= 1).all()
    # part: studies
    from project.studies.folds import KFold

    with pytest.raises(UserError, match="tag 'cat' has .* image"):
        few = write_csv(
            tmp_path / "few.csv", ["data/img/0.png,cat", "data/img/1.png,dog", "data/img/2.png,dog"]
        )
        csv_dm(few, tmp_path, kind="tags", split=KFold(2)).class_names  # noqa: B018  # the first scan
    folds = [
        csv_dm(csv, tmp_path, label_column="tags", kind="tags", split=KFold(4, k))._split()[1]
        for k in range(4)
    ]
    assert sorted(i for f in folds for i in f) == list(range(40))
    # /part: studies


def test_the_training_targets_are_those_of_the_part_that_trains(tmp_path):
    csv = tagged(tmp_path, n=40)
    dm = csv_dm(csv, tmp_path, label_column="tags", kind="tags", val_fraction=0.25)
    dm.setup("fit")
    train = dm.train_set.targets[dm.train_set.indices]
    assert torch.equal(dm.train_targets, train) and len(train) == 30  # the validation images left out


def test_a_multilabel_validation_split_that_comes_out_empty_says_what_to_change(tmp_path):
    write_images(tmp_path / "img", 3)
    csv = write_csv(tmp_path / "t.csv", ["img/0.png,cat", "img/1.png,", "img/2.png,cat dog"])
    with pytest.raises(
        UserError, match=r"data.val_fraction=0.1 leaves no image to validate on.*raise data.val_fraction"
    ):
        csv_dm(csv, tmp_path, kind="tags", val_fraction=0.1).setup("fit")


def test_tags_holding_a_separator_are_one_warning_naming_tag_and_setting(tmp_path, capsys):
    csv = labelled(tmp_path, ["red;round", "blue", '"red,round"', "red round", "blue", "round"] * 2)
    dm = csv_dm(csv, tmp_path, kind="tags")
    assert "red;round" in dm.class_names  # the run goes on, as told
    (said,) = warnings_of(capsys.readouterr().err)
    assert "'red,round'" in said and "row 4" in said and "whitespace (data.label_separator)" in said
    assert "(and 1 more tag(s) like it)" in said and "--data.label_separator ','" in said


@pytest.mark.parametrize("tags", [[""] * 6, ["red", ""] * 3], ids=["no tags", "one tag"])
def test_a_multilabel_csv_with_fewer_than_two_tags_is_one_line(tmp_path, capsys, tags):
    csv = labelled(tmp_path, tags)
    error = fails(fit_args(csv, tmp_path, config="csv_multilabel.yaml"), capsys)
    assert "labels.csv" in error and "at least two tags" in error and "one of two labels" in error


def test_an_empty_label_separator_names_its_key(tmp_path, capsys):
    csv = labelled(tmp_path, ["red blue", "blue"] * 3)
    error = fails(fit_args(csv, tmp_path, "--data.label_separator", "", config="csv_multilabel.yaml"), capsys)
    assert "data.label_separator is empty" in error


def test_a_bad_csv_of_tags_is_named_with_its_row_and_value(tmp_path):
    d = tmp_path / "data"
    write_images(d / "img", 2)
    not_0_or_1 = write_csv(d / "oh.csv", ["img/0.png,1,0.0", "img/1.png,yes,1"], header="file,a,b")
    with pytest.raises(UserError, match=r"oh\.csv row 3: column 'a' holds 'yes'; label_columns hold 0 or 1"):
        csv_dm(not_0_or_1, tmp_path, label_columns=["a", "b"], kind="tags").setup("fit")
    missing = write_csv(d / "mt.csv", ["img/0.png,1,0"], header="file,a,b")
    with pytest.raises(UserError, match=r"mt\.csv has no column 'c' .*: file, a, b"):
        csv_dm(missing, tmp_path, label_columns=["a", "c"], kind="tags").setup("fit")
    with pytest.raises(UserError, match="data.label_columns names 1 column"):
        csv_dm(missing, tmp_path, label_columns=["a"], kind="tags").setup("fit")
