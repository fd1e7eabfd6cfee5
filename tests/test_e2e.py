"""`python -m project` end to end in subprocesses: fit, then validate/test/predict/resume from its checkpoint."""

import csv
from pathlib import Path

import pytest
import torch

from tests.conftest import CONFIGS, newest_run, run_cli
from tests.wandb_reader import read_run

pytestmark = pytest.mark.slow


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_cifar_fit_validate_test_predict_resume(fake_cifar, tmp_path):
    common = [
        "--config", CONFIGS / "cifar10.yaml",
        "--model.net", "SimpleCNN", "--model.scheduler.init_args.max_lr", "0.02",  # the ResNet recipe's 0.2 diverges here
        "--data.data_dir", fake_cifar, "--data.download", "false", "--data.val_size", "100", "--data.batch_size", "50",
        "--trainer.precision", "32-true", "--trainer.default_root_dir", tmp_path / "logs",
    ]  # fmt: skip
    run_cli("fit", *common, "--trainer.max_epochs", "2", cwd=tmp_path)

    run = tmp_path / "logs" / "runs" / "version_0"
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.exists() and len(list(run.glob("checkpoints/epoch*.ckpt"))) == 1
    assert (run / "config.yaml").exists()
    rows = read_metrics(run)
    val_rows = [r for r in rows if r["val/acc"]]
    assert [int(r["epoch"]) for r in val_rows] == [0, 1]
    assert all(0.0 <= float(r["val/acc"]) <= 1.0 for r in val_rows)
    assert any(r["train/loss"] for r in rows)

    (wandb_run,) = (tmp_path / "logs" / "wandb").glob("offline-run-*")
    recorded = read_run(wandb_run, finished=True)
    assert any("val/acc" in row for row in recorded["history"])
    assert recorded["config"]["model"]["init_args"]["net"]["class_path"] == "project.models.SimpleCNN"
    assert recorded["config"]["data"]["init_args"]["val_size"] == 100

    checkpoint = torch.load(ckpt, weights_only=True)
    assert checkpoint["epoch"] == 1 and checkpoint["CIFARDataModule"]["class_names"][0] == "airplane"

    out = run_cli("validate", *common, "--ckpt_path", ckpt, "--trainer.logger", "false", cwd=tmp_path).stdout
    assert "val/acc" in out
    out = run_cli("test", *common, "--ckpt_path", ckpt, "--trainer.logger", "false", cwd=tmp_path).stdout
    assert "test/acc" in out

    run_cli("predict", *common, "--ckpt_path", ckpt, "--trainer.logger", "false", cwd=tmp_path)
    with open(newest_run(tmp_path / "logs") / "predictions.csv") as f:  # each command in its own run folder
        predictions = list(csv.DictReader(f))
    assert len(predictions) == 100 and predictions[7]["input"] == "cifar10/test/7"
    assert {p["class_name"] for p in predictions} <= set(checkpoint["CIFARDataModule"]["class_names"])
    assert all(0.1 <= float(p["probability"]) <= 1.0 for p in predictions)

    # Resuming continues from the saved epoch (the third epoch is the only one the second run trains).
    run_cli("fit", *common, "--trainer.max_epochs", "3", "--ckpt_path", ckpt, cwd=tmp_path)
    resumed = read_metrics(newest_run(tmp_path / "logs"))
    trained = [r for r in resumed if not r.get("test/acc")]
    assert {int(r["epoch"]) for r in trained} == {2}
    assert int(trained[-1]["step"]) == 3 * 8 - 1  # 8 batches of 50 per epoch
    # ... and then the fit tests its best checkpoint (CIFAR has a test split): one row, after the training.
    assert [r for r in resumed if r.get("test/acc")] == resumed[len(trained) :] != []


def test_folder_fit_and_predict(image_folder, tmp_path):
    common = [
        "--config", CONFIGS / "folder.yaml", "--config", CONFIGS / "debug.yaml",
        "--data.root", image_folder, "--data.image_size", "32", "--data.batch_size", "8",
        "--data.cache_dir", tmp_path / "cache", "--trainer.default_root_dir", tmp_path / "logs",
    ]  # fmt: skip
    failed = run_cli("fit", *common, cwd=tmp_path, check=False)
    assert failed.returncode == 1 and "broken.jpg" in failed.stderr and "Traceback" not in failed.stderr

    run_cli("fit", *common, "--data.skip_corrupt", "true", cwd=tmp_path)
    ckpt = newest_run(tmp_path / "logs") / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    run_cli(
        "predict",
        *common,
        "--data.skip_corrupt",
        "true",
        "--ckpt_path",
        ckpt,
        "--trainer.limit_predict_batches",
        "1.0",
        cwd=tmp_path,
    )
    with open(newest_run(tmp_path / "logs") / "predictions.csv") as f:
        predictions = list(csv.DictReader(f))
    assert predictions and all(Path(p["input"]).exists() for p in predictions)
    assert {p["class_name"] for p in predictions} <= {"c0", "c1", "c2"}


@pytest.mark.parametrize(
    "switches",
    [
        ["--trainer.fast_dev_run", "true"],
        ["--trainer.max_steps", "3", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"],
    ],
    ids=["fast_dev_run", "max_steps-no-logger-no-checkpointing"],
)
def test_common_switches_just_work(fake_cifar, tmp_path, switches):
    proc = run_cli(
        "fit", "--config", CONFIGS / "cifar10.yaml", "--model.net", "SimpleCNN", "--trainer.accelerator", "cpu",
        "--trainer.precision", "32-true", "--data.data_dir", fake_cifar, "--data.download", "false",
        "--data.val_size", "100", "--data.batch_size", "50", "--trainer.default_root_dir", tmp_path / "logs", *switches,
        cwd=tmp_path,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr
    # Neither a fast_dev_run (Lightning documents it writes no checkpoint) nor disabled checkpointing leaves
    # a checkpoint that `--ckpt_path last` could later resume from.
    assert not list((tmp_path / "logs").rglob("*.ckpt"))
