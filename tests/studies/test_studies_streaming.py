"""The folds `prepare --num_folds` stores, read back by the streaming DataModule under cross-validation's split."""

import json

import pytest

from project.cli import main
from project.streaming.source import METADATA, StreamingImageDataModule
from project.studies.folds import KFold
from tests.conftest import run_cli
from tests.test_streaming import fit_args, one_line_error, prepare_args, prepared  # noqa: F401  # (the fixture)


def test_prepare_records_stratified_folds_the_datamodule_reads(prepared):  # noqa: F811  # (the fixture)
    meta = json.loads((prepared / METADATA).read_text())
    assert meta["folds"] == {"seed": 0, "sizes": [2] * 5}  # 5 images of each class in 5 folds (the default)

    def images(dataset) -> dict[float, int]:
        """pixel sum -> label of every image of a split, which the sums tell apart."""
        return {float(x.double().sum()): int(y) for x, y in (dataset[i] for i in range(len(dataset)))}

    whole = StreamingImageDataModule(str(prepared), image_size=8, num_workers=0)
    whole.setup("fit")
    every = images(whole.train_set)
    validated: list[float] = []
    for fold in range(5):
        data = StreamingImageDataModule(str(prepared), image_size=8, num_workers=0, split=KFold(5, fold))
        data.setup("fit")
        train, val = images(data.train_set), images(data.val_set)
        assert sorted(val.values()) == [0, 1]  # stratified: one image of each class
        assert len(train) == 8 and not set(train) & set(val) and train | val == every
        validated += list(val)
    assert sorted(validated) == sorted(every)  # every training image validates in exactly one fold
    data = StreamingImageDataModule(
        str(prepared), image_size=8, batch_size=2, num_workers=0, split=KFold(5, 4)
    )
    data.setup("fit")
    loaded = [float(x.double().sum()) for batch, _ in data.train_dataloader() for x in batch]
    assert sorted(loaded) == sorted(train)  # the training folds stream through the loader, each image once


@pytest.mark.slow
def test_folds_other_than_those_prepared_are_one_line(prepared, tmp_path, capsys):  # noqa: F811
    kfold = ["--data.split", "KFold", "--data.split.num_folds"]
    err = one_line_error(fit_args(prepared, tmp_path, *kfold, "3"), capsys)
    assert (
        f"data.split.num_folds=3: {prepared} was prepared with 5 folds; prepare it again with --num_folds 3"
        in err
    )
    out = tmp_path / "no_folds"
    main(prepare_args(prepared.parent / "images", out, "--num_folds", "null"))
    err = one_line_error(fit_args(out, tmp_path, *kfold, "5"), capsys)
    assert f"{out} was prepared without folds" in err


@pytest.mark.slow
def test_cv_over_the_prepared_folds(prepared, tmp_path):  # noqa: F811
    args = fit_args(prepared, tmp_path, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2")
    result = run_cli(
        "cv", *args[1:], "--folds", "5", "--folds_to_run", "0,4", "--wandb", "false", cwd=tmp_path
    )
    study = tmp_path / "cv" / "streaming"
    for k in (0, 4):
        fold = json.loads((study / f"fold_{k}" / "fold_result.json").read_text())
        assert fold["fold"] == k and 0 <= fold["val/acc"] <= 1
    assert "folds 1, 2, 3 are not complete yet" in result.stdout
