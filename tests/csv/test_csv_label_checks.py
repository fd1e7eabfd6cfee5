"""A CSV's labels checked at every start: names that split one class in two (case, a typo, Unicode forms) and
single-image classes are one warning line each and the run goes on; labels that look like several tags, a test
label training never saw, odd numbers and huge cells are each one line; cross-validation says the data's warnings
once."""

import unicodedata
from pathlib import Path

import pytest

from project.cli import main
from project.errors import UserError
from tests.conftest import CONFIGS, run_cli
from tests.csv.test_csv_data import csv_dm, write_csv, write_images
from tests.test_bad_input import fails

DECOMPOSED = unicodedata.normalize("NFD", "café")
COMPOSED = unicodedata.normalize("NFC", "café")


def labelled(tmp_path: Path, labels: list[str], name: str = "labels.csv") -> Path:
    """A CSV giving `img/<i>.png` (written here) label `labels[i]`."""
    write_images(tmp_path / "img", len(labels))
    return write_csv(tmp_path / name, [f"img/{i}.png,{label}" for i, label in enumerate(labels)])


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def fit_args(csv: Path, tmp_path: Path, *extra: object, config: str = "csv.yaml") -> list[str]:
    """`fit` with a shipped config as a user runs it on `csv`, shrunk to one tiny batch."""
    args = [
        "fit", "--config", CONFIGS / config, "--data.csv", csv, "--data.cache_dir", tmp_path / "cache",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "4", "--model.net.init_args.hidden", "8",
        "--data.image_size", "8", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", tmp_path / "logs", *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


# -- names that split a class: one warning line each, the run goes on -----------------------------------------
def test_case_a_typo_and_single_images_are_one_warning_line_each_and_the_fit_goes_on(tmp_path, capsys):
    csv = labelled(tmp_path, ["cat"] * 6 + ["dog"] * 6 + ["Cat", "dgo"])
    main(fit_args(csv, tmp_path))  # returns: the fit went on
    said = warnings_of(capsys.readouterr().err)
    case = [w for w in said if "differ only in case" in w]
    typo = [w for w in said if "one character away" in w]
    single = [w for w in said if "single image" in w]
    assert len(case) == len(typo) == len(single) == 1, said
    assert "'Cat' (1 image) and 'cat' (6 images)" in case[0] and "labels.csv" in case[0]
    assert "'dgo' (1 image)" in typo[0] and "'dog' (6 images)" in typo[0]
    assert "2 classes" in single[0] and "'Cat', 'dgo'" in single[0]


def test_a_label_in_two_unicode_forms_is_one_class_with_one_warning(tmp_path, capsys):
    dm = csv_dm(labelled(tmp_path, [COMPOSED] * 4 + [DECOMPOSED] * 2 + ["tea"] * 6), tmp_path)
    assert dm.class_names == [COMPOSED, "tea"] and dm.train_labels[:6] == [0] * 6
    (said,) = warnings_of(capsys.readouterr().err)
    assert "2 Unicode forms" in said and "'cafe\\u0301'" in said and "read as one" in said


# -- the shape of the labels -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "labels, why",
    [
        (["blue", "round", "blue round"] * 4, "'blue', 'round' are labels of their own"),
        (["blue round", "red", "round blue", "red"] * 3, "the same words in another order"),
    ],
)
def test_a_multilabel_csv_given_to_the_single_label_config_is_one_line(tmp_path, capsys, labels, why):
    error = fails(fit_args(labelled(tmp_path, labels), tmp_path), capsys)
    assert "labels.csv row 4" in error and "looks like several tags" in error and why in error
    # part: tags
    assert error.endswith("or, for a multi-label CSV, read them as tags: data.kind tags")
    # /part: tags


def test_a_test_label_training_never_saw_is_refused_before_the_fit(tmp_path, capsys):
    csv = labelled(tmp_path, ["a", "b"] * 4)
    test = write_csv(tmp_path / "test.csv", ["img/0.png,a", "img/1.png,b", "img/2.png,zebra"])
    error = fails(fit_args(csv, tmp_path, "--data.test_csv", test), capsys)
    assert "test.csv row 4" in error and "'zebra'" in error and "labels.csv" in error
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before anything trained


@pytest.mark.parametrize("odd", ["--1", "²"])
def test_labels_int_cannot_read_are_names(tmp_path, odd):
    dm = csv_dm(labelled(tmp_path, ["1", "2", odd] * 3), tmp_path)
    assert sorted(dm.class_names) == sorted(["1", "2", odd]) and len(set(dm.train_labels)) == 3


def test_a_huge_cell_is_one_short_line_with_its_row(tmp_path):
    csv = labelled(tmp_path, ["a", "b"] * 3)
    csv.write_text(csv.read_text() + "img/0.png," + "x" * 200_000 + "\n")
    with pytest.raises(UserError) as error:
        csv_dm(csv, tmp_path).class_names  # noqa: B018  # the first scan
    message = str(error.value)
    assert "labels.csv row 8" in message and "131,072 characters" in message and "quote" in message
    assert len(message) < 400 and "\n" not in message


# -- said once -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", [True, False])
def test_unreadable_images_left_out_are_told_once(tmp_path, capsys, cache):
    csv = labelled(tmp_path, ["a", "b"] * 6)
    for i in range(0, 12, 2):  # every image of class a: in the part that trains and in the one that validates
        (tmp_path / "img" / f"{i}.png").write_bytes(b"not a png")
    csv_dm(csv, tmp_path, skip_corrupt=True, cache=cache).setup("fit")
    said = [w for w in warnings_of(capsys.readouterr().err) if "unreadable" in w]
    assert len(said) == 1 and "leaving out 6 unreadable" in said[0], said


@pytest.mark.slow
def test_cross_validation_says_a_data_warning_once(tmp_path):
    csv = labelled(tmp_path, ["a", "b"] * 6 + ["a"])
    csv.write_text(csv.read_text() + "img/0.png,a\n")  # a repeated row: a warning of every build of the data
    args = fit_args(csv, tmp_path, "--trainer.fast_dev_run", "false", "--trainer.max_epochs", "1")
    run = run_cli("cv", *args[1:], "--folds", "2", "--wandb", "false", cwd=tmp_path, timeout=600)
    assert run.stderr.count("repeat an image listed before") == 1, run.stderr
