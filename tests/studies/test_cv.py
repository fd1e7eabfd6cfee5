"""K-fold cross-validation: the folds (project/studies/folds.py, KFold, held by the DataModules) and `python -m
project cv`.

Fast tests check the folds and every bad input in-process; the end-to-end run (slow) kills a real study in
its last fold, resumes it, and checks the table, the test ensemble and the W&B runs against the fold results.
"""

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
import torch

from project.cli import main, split_args
from project.data import CIFARDataModule, ImageFolderDataModule
from project.data.decoded_cache import channel_mean_std
from project.data.splits import stratified_parts
from project.data.targets import Classes
from project.errors import UserError
from project.studies.cv import continues_alike, fold_numbers, parse_args
from project.studies.cv_results import summarize
from project.studies.folds import KFold
from project.studies.runner import SETTINGS_FILE, claim_folder
from tests.conftest import run_cli
from tests.folder_fits import tiny_fit_args, tiny_folder
from tests.wandb_reader import read_records, read_run

LABELS = [0] * 7 + [1] * 12 + [2] * 5 + [1] * 3  # uneven classes, not sorted


def folds(labels: list[int], k: int, seed: int) -> list[list[int]]:
    return stratified_parts(labels, k, seed, Classes(tuple(str(c) for c in range(max(labels) + 1))))


def test_a_fold_validates_and_the_others_train():
    train, val = KFold(3, 1).split(LABELS, 0, Classes(("a", "b", "c")))
    assert val == folds(LABELS, 3, seed=0)[1] and sorted(train + val) == list(range(len(LABELS)))
    assert not set(train) & set(val)
    assert KFold(3, 1).stored_rows([2, 3, 2], "prepared") == (
        [0, 1, 5, 6],
        [2, 3, 4],
    )  # stored fold after fold


def test_image_folder_folds_are_the_same_on_every_rank(tmp_path, monkeypatch):
    data = tiny_folder(tmp_path / "images", per_class=7)
    splits = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        dm = ImageFolderDataModule(str(data), image_size=8, split=KFold(3, 2), cache_dir=str(tmp_path / "c"))
        splits.append(dm._split())
    assert splits[0] == splits[1]
    assert splits[0][1] == folds(dm.train_labels, 3, dm.seed)[2]


@pytest.mark.slow
def test_a_folds_statistics_come_from_its_training_folds_only(tmp_path):
    data = tiny_folder(tmp_path / "images", per_class=7)
    cache = tmp_path / "cache"
    stats = []
    for fold in (0, 1):
        dm = ImageFolderDataModule(str(data), image_size=8, split=KFold(3, fold), cache_dir=str(cache))
        dm.setup("fit")
        train, val = dm.train_set.indices, dm.val_set.indices
        assert sorted(train.tolist() + val.tolist()) == list(range(21)) and len(val) == 7
        images = torch.from_numpy(dm._cache("train").images[train.numpy()])
        assert dm.mean == pytest.approx(channel_mean_std([images])[0])
        assert dm.std == pytest.approx(channel_mean_std([images])[1])
        stats.append(dm.mean)
    everything = torch.from_numpy(dm._cache("train").images[:])
    assert stats[0] != pytest.approx(channel_mean_std([everything])[0])  # the validation fold is left out
    assert stats[0] != stats[1]
    # One image cache for all folds; it keeps the statistics of each fold's training part.
    (meta,) = cache.glob("*.json")
    assert len(list(cache.glob("*.npy"))) == 1 and len(json.loads(meta.read_text())["stats"]) == 2


def test_cifar_folds_split_the_training_set_and_take_their_statistics_from_it(fake_cifar):
    dm = CIFARDataModule(data_dir=str(fake_cifar), download=False, val_size=100, split=KFold(5, 3))
    dm.setup("fit")
    train, val = dm.train_set.indices, dm.val_set.indices
    assert len(train) == 400 and len(val) == 100 and not set(train.tolist()) & set(val.tolist())
    targets = dm.train_set.targets
    assert val.tolist() == folds(targets.tolist(), 5, dm.seed)[3]
    assert dm.mean == pytest.approx(channel_mean_std([dm.train_set.images[train]])[0])


def test_summary_mean_and_std_are_those_of_the_folds():
    results = [
        {"val/acc": a, "val/loss": loss, "epoch": e, "class_acc": {"x": a, "y": 1 - a}}
        for a, loss, e in [(0.5, 1.0, 1), (0.75, 0.5, 2), (0.6, 0.8, 2)]
    ]
    summary = summarize(results)
    assert summary["val/acc"]["mean"] == pytest.approx(statistics.fmean([0.5, 0.75, 0.6]))
    assert summary["val/loss"]["std"] == pytest.approx(statistics.stdev([1.0, 0.5, 0.8]))
    assert summary["class_acc"] == pytest.approx({"x": 0.6166667, "y": 0.3833333})


def test_cv_flags_are_its_own_and_the_rest_goes_to_fit_in_order():
    args = [
        "--config",
        "a.yaml",
        "--folds",
        "3",
        "--trainer.max_epochs=2",
        "--folds_to_run",
        "0,2",
        "--config",
        "b",
    ]
    kwargs = parse_args(args)
    assert kwargs["folds"] == 3 and kwargs["folds_to_run"] == "0,2"
    assert kwargs["fit_args"] == ["--config", "a.yaml", "--trainer.max_epochs=2", "--config", "b"]
    assert split_args(["--x", "1", "--flag", "--y=2"], {"flag"}) == (["--flag"], ["--x", "1", "--y=2"])
    assert fold_numbers(5, "2,0") == [0, 2] and fold_numbers(3, None) == [0, 1, 2]


def test_a_rerun_with_other_settings_names_the_first_difference(tmp_path):
    claim_folder(
        tmp_path, {"folds": 5, "fit": {"trainer": {"max_epochs": 2}}}, "the cross-validation", "--name"
    )
    claim_folder(
        tmp_path, {"folds": 5, "fit": {"trainer": {"max_epochs": 2}}}, "the cross-validation", "--name"
    )
    with pytest.raises(Exception, match=r"started with trainer.max_epochs=2, this command has 3"):
        claim_folder(
            tmp_path, {"folds": 5, "fit": {"trainer": {"max_epochs": 3}}}, "the cross-validation", "--name"
        )


def _study(tmp_path: Path, trained: tuple[int, ...] = (), finished: tuple[int, ...] = ()) -> Path:
    """A study folder started with max_steps 5, whose folds `trained` have a checkpoint, `finished` a result."""
    study = tmp_path / "cv" / "folder"
    claim_folder(study, _settings(max_steps=5), "the cross-validation", "--name")
    for k in trained:
        (study / f"fold_{k}" / "runs" / "version_0" / "checkpoints").mkdir(parents=True)
        (study / f"fold_{k}" / "runs" / "version_0" / "checkpoints" / "last.ckpt").write_text("")
    for k in finished:
        (study / f"fold_{k}").mkdir(parents=True, exist_ok=True)
        (study / f"fold_{k}" / "fold_result.json").write_text("{}")
    return study


def _settings(folds: int = 3, **trainer: object) -> dict:
    return {"folds": folds, "fit": {"trainer": {"max_steps": 5, "limit_val_batches": 1.0} | trainer}}


def _rerun(study: Path, settings: dict) -> None:
    claim_folder(study, settings, "the cross-validation", "--name", accept_change=continues_alike(study))


@pytest.mark.parametrize(
    "settings",
    [_settings(max_steps=2), _settings(limit_val_batches=0.5), _settings(folds=4)],
)
def test_a_study_no_fold_of_which_trained_takes_the_corrected_settings(settings, tmp_path):
    study = _study(tmp_path)
    (study / "fold_0").mkdir()  # a fold folder without a checkpoint: nothing trained yet
    _rerun(study, settings)
    assert json.loads((study / SETTINGS_FILE).read_text()) == settings
    _rerun(study, settings)  # and continues under them


def test_trained_folds_continue_under_a_longer_training_only(tmp_path):
    study = _study(tmp_path, trained=(0, 2))
    _rerun(study, _settings(max_steps=7, max_epochs=None))  # longer: fit continues their runs
    assert json.loads((study / SETTINGS_FILE).read_text()) == _settings(max_steps=7, max_epochs=None)
    for settings, key in [
        (_settings(max_steps=3), r"trainer.max_steps=7, this command has 3"),  # shorter: they trained past it
        (
            _settings(max_steps=7, limit_val_batches=0.5),
            r"trainer.limit_val_batches=1.0, this command has 0.5",
        ),
        (_settings(folds=4, max_steps=7), r"folds=3, this command has 4"),
    ]:
        with pytest.raises(UserError) as error:
            _rerun(study, settings)
        assert re.search(
            rf"^the cross-validation {study} was started with {key}, and fold_0, fold_2 trained with the "
            rf"recorded settings already \(no fold has finished\): delete {study}/fold_0 {study}/fold_2 to "
            "train them anew",
            str(error.value),
        ), error.value
    assert json.loads((study / SETTINGS_FILE).read_text())["fit"]["trainer"]["max_steps"] == 7


def test_once_a_fold_finished_no_setting_may_change(tmp_path):
    study = _study(tmp_path, trained=(0, 1), finished=(0,))
    for settings in (_settings(max_steps=9), _settings(limit_val_batches=0.5)):
        with pytest.raises(
            UserError, match=r", and fold_0 finished with the recorded settings: rerun it with"
        ) as e:
            _rerun(study, settings)
        assert str(e.value).endswith(f"or delete {study} to start over with the new ones")
    _rerun(study, _settings())  # the recorded settings continue it
    assert json.loads((study / SETTINGS_FILE).read_text()) == _settings()


def _one_error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["cv", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--folds", "1"], r"^error: --folds must be at least 2, got 1$"),
        (["--folds", "3", "--folds_to_run", "3"], r"^error: --folds_to_run 3: folds are numbered 0 to 2$"),
        (
            ["--folds", "10"],
            r"^error: class 'c0' has 9 image\(s\), fewer than data.split.num_folds=10: every fold",
        ),
        (["--folds", "3", "--ckpt_path", "last"], r"^error: --ckpt_path is set by the study for every run"),
        (["--folds", "3", "--model.nott_a_key", "1"], r"^error: .*nott_a_key"),
        (["--folds", "3", "--data.val_fraction", "2"], r"^error: data.val_fraction must be in \(0, 1\)"),
        # Settings under which no fold could produce its result: named before the first fold trains.
        (
            ["--trainer.limit_val_batches", "0"],
            r"^error: trainer.limit_val_batches=0: the runs would never valid",
        ),
        (
            ["--trainer.check_val_every_n_epoch", "3"],
            r"^error: trainer.check_val_every_n_epoch=3 with trainer.max_epochs=2: the runs would never valid",
        ),
        (
            ["--trainer.enable_checkpointing", "false"],
            r"^error: trainer.enable_checkpointing=False writes no checkpoints: the cross-validation evaluates",
        ),
        (["--checkpoint.save_last", "false"], r"^error: checkpoint.save_last=False writes no last.ckpt"),
        (["--checkpoint.save_top_k", "0"], r"^error: checkpoint.save_top_k=0 keeps no best checkpoint"),
    ],
)
def test_bad_input_is_one_line_before_any_fold_runs(extra, expected, tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    assert re.search(expected, _one_error_line([*tiny_fit_args(data, tmp_path), *extra], capsys))
    assert not (tmp_path / "logs").exists() and not (tmp_path / "cache").exists()  # nothing was written


def test_an_explicit_val_folder_is_refused_saying_what_to_do(tmp_path, capsys):
    data = tiny_folder(tmp_path / "images", per_class=4, test=True)
    tiny_folder(data / "val", per_class=2)
    line = _one_error_line([*tiny_fit_args(data, tmp_path), "--folds", "3"], capsys)
    assert re.search(
        r"^error: data.split KFold\(num_folds=3, fold=0\) with the validation folder .*/val: .*Move its images into",
        line,
    )


@pytest.mark.parametrize(
    ("folds", "fold", "expected"),
    [
        ("3", "3", r"^error: data.split.fold=3 is outside \[0, 3\) \(data.split.num_folds=3\)$"),
        ("3", "-1", r"^error: data.split.fold=-1 is outside \[0, 3\)"),
        ("1", "0", r"^error: data.split.num_folds must be at least 2, got 1$"),
    ],
)
def test_a_fold_outside_the_folds_is_one_line_from_fit(folds, fold, expected, tmp_path, capsys):
    data = tiny_folder(tmp_path / "images", per_class=4)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_fit_args(data, tmp_path), "--data.split", "KFold", "--data.split.num_folds", folds,
              "--data.split.fold", fold])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and re.search(expected, err[-1]), err


def test_cv_help_lists_its_own_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--folds_to_run" in out and "--test_ensemble" in out and "passed to each `fit` unchanged" in out


@pytest.mark.slow
def test_cv_killed_in_its_last_fold_resumes_it_and_skips_the_finished_ones(tmp_path):
    data = tiny_folder(tmp_path / "images", test=True)
    marker = tmp_path / "killed"
    probe = {
        "class_path": "tests.study_runs.KillOnce",
        "init_args": {"marker": str(marker), "match": "fold_2"},
    }
    args = ["cv", *tiny_fit_args(data, tmp_path, "--trainer.max_epochs", "3"), "--folds", "3"]
    args += [f"--trainer.callbacks+={json.dumps(probe)}"]

    killed = run_cli(*args, "--wandb", "false", cwd=tmp_path, check=False)
    assert killed.returncode == 1 and marker.exists(), killed.stderr[-3000:]
    assert "error: fold 2 of 3 did not finish (killed by signal 9" in killed.stderr.strip().splitlines()[-1]
    study = tmp_path / "logs" / "cv" / "folder"
    assert [p.name for p in sorted(study.glob("fold_*/fold_result.json"))] == ["fold_result.json"] * 2

    resumed = run_cli(*args, "--test_ensemble", "true", cwd=tmp_path)
    out = resumed.stdout
    assert "fold 0: complete" in out and "fold 1: complete" in out
    assert "--ckpt_path last: " in out and "fold_2" in out.split("--ckpt_path last: ")[1].splitlines()[0]
    assert out.count("--ckpt_path last: ") == 1  # only fold 2 ran again, continuing its run
    with open(study / "fold_2" / "runs" / "version_0" / "metrics.csv") as f:
        epochs = {row["epoch"] for row in csv.DictReader(f)}
    assert {"0", "2"} <= epochs and not (
        study / "fold_2" / "runs" / "version_1"
    ).exists()  # one run, continued

    results = json.loads((study / "cv_results.json").read_text())
    folds = results["folds"]
    assert [f["fold"] for f in folds] == [0, 1, 2] and sum(f["val_images"] for f in folds) == 27
    assert results["summary"]["val/acc"]["mean"] == pytest.approx(
        statistics.fmean(f["val/acc"] for f in folds)
    )
    assert results["summary"]["val/loss"]["std"] == pytest.approx(
        statistics.stdev(f["val/loss"] for f in folds)
    )
    for f in folds:  # the in-process evaluation of the best checkpoint is the accuracy fit recorded for it
        assert f["val/acc"] == pytest.approx(f["monitored_best"], abs=1e-6)
        assert f"epoch{f['epoch']:03d}" in Path(f["checkpoint"]).name
    ensemble = results["test_ensemble"]
    assert ensemble["test_images"] == 12 and len(ensemble["test/acc_per_fold"]) == 3
    assert ensemble["test/acc_single"]["mean"] == pytest.approx(
        statistics.fmean(ensemble["test/acc_per_fold"])
    )
    table = (study / "cv_results.md").read_text()
    assert "mean ± std" in table and "Test split (12 images)" in table and table in out

    # W&B: every fold's run and the summary run share one group; the summary run holds the table.
    records = {
        p: [r.run for r in read_records(p) if r.WhichOneof("record_type") == "run"]
        for p in study.rglob("run-*.wandb")
    }
    runs = {p: found[0] for p, found in records.items() if found}
    assert {r.run_group for r in runs.values()} == {"cv-folder"} and len(runs) >= 4
    (summary_dir,) = [p.parent for p, r in runs.items() if r.job_type == "cv-summary"]
    logged = read_run(summary_dir, finished=True)["history"][0]
    assert logged["cv/folds/_type"] == "table-file" and logged["cv/folds/nrows"] == 3


@pytest.mark.slow
def test_a_cv_whose_folds_end_by_max_steps_within_an_epoch_completes(tmp_path):
    data = tiny_folder(tmp_path / "images")  # 2 folds: 13 or 14 training images, 3 batches of 4 an epoch
    flags = ["--trainer.max_steps", "1", "--data.batch_size", "4", "--trainer.logger", "false"]
    args = ["cv", *tiny_fit_args(data, tmp_path, *flags)]
    run_cli(*args, "--folds", "2", "--wandb", "false", cwd=tmp_path)
    results = json.loads((tmp_path / "logs" / "cv" / "folder" / "cv_results.json").read_text())
    assert [(f["fold"], f["epoch"]) for f in results["folds"]] == [(0, 0), (1, 0)]
    for f in results["folds"]:  # each fold's best is the validation at its one step
        assert f["val/acc"] == pytest.approx(f["monitored_best"], abs=1e-6)


# -- cv's evaluation and the W&B dashboard ----------------------------------------------------------------------
def test_a_studys_fits_test_nothing_and_the_setting_is_the_studys(tmp_path):
    """A fold's or trial's fit reads its best checkpoint back for the study: it runs no test of its own (each would
    cost a pass over the test split the study does not read), and the setting is the study's to give."""
    from project.studies.runner import fit_command, parse_fit_args

    command = fit_command(["--config", "configs/cifar10.yaml"], tmp_path, resume=False)
    assert command[command.index("--test_after_fit") + 1] == "false"
    with pytest.raises(UserError, match="--test_after_fit is set by the study"):
        parse_fit_args(["--config", "configs/cifar10.yaml", "--test_after_fit", "true"])
