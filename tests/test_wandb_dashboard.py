"""W&B dashboards read back from an offline run: metrics, config, confusion matrix, worst-prediction table
and histograms."""

import json
import re
from pathlib import Path

import pytest

from project.cli import build
from tests.conftest import CONFIGS, run_cli
from tests.fakes import CIFAR10_CLASSES
from tests.wandb_reader import read_records, read_run


@pytest.mark.slow
def test_offline_run_records_metrics_config_confusion_matrix_and_worst_predictions(
    fake_cifar, tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # offline artifacts are staged here
    logs = tmp_path / "logs"
    run_cli(
        "fit", "--config", CONFIGS / "cifar10.yaml", "--config", CONFIGS / "callbacks" / "diagnostics.yaml",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "8", "--model.net.init_args.hidden", "32",
        "--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", "0.003", "--model.scheduler", "null",
        "--data.data_dir", fake_cifar, "--data.download", "false", "--data.val_size", "100",
        "--data.batch_size", "50", "--trainer.max_epochs", "2", "--trainer.precision", "32-true",
        "--trainer.log_every_n_steps", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", logs, "--wandb_dashboard.watch_log_freq", "2",
        cwd=tmp_path,
        timeout=900,  # minutes on a loaded 2-core machine
    )  # fmt: skip
    (run_dir,) = (logs / "wandb").glob("offline-run-*")
    run = read_run(run_dir, finished=True)
    keys = {key for row in run["history"] for key in row}

    assert {"val/acc", "train/loss", "grad_norm/total", "train/data_wait_step"} <= keys
    assert "grad_norm/net.features.0.weight" in keys and "update_ratio/net.features.0.weight" in keys
    assert any(k.startswith("gradients/net.") for k in keys) and any(
        k.startswith("parameters/net.") for k in keys
    )
    assert run["config"]["wandb_dashboard"]["init_args"]["watch"] == "all"
    assert run["config"]["model"]["init_args"]["net"]["class_path"] == "project.models.SimpleCNN"

    # The confusion matrix: a 10 x 10 table of counts over the 100 validation images, logged every epoch.
    logged = [row for row in run["history"] if "val/confusion_matrix_table/path" in row]
    assert (
        len(list((run_dir / "files" / "media" / "table" / "val").glob("confusion_matrix_table_*.json"))) == 2
    )
    assert len(logged) == 2 and all(row["val/confusion_matrix_table/_type"] == "table-file" for row in logged)
    table = json.loads((run_dir / "files" / run["summary"]["val/confusion_matrix_table/path"]).read_text())
    assert table["columns"] == ["Actual", "Predicted", "nPredictions"] and len(table["data"]) == 100
    assert sum(row[2] for row in table["data"]) == 100
    assert {row[0] for row in table["data"]} == set(CIFAR10_CLASSES)

    # The worst predictions: a table artifact with the 16 images, their classes and confidences.
    artifacts = [
        r.artifact for r in read_records(next(run_dir.glob("run-*.wandb"))) if r.HasField("artifact")
    ]
    worst = [a for a in artifacts if "worst_predictions" in a.name][-1]
    files = {entry.path: entry.local_path for entry in worst.manifest.contents}
    assert sum(path.startswith("media/images/") and path.endswith(".png") for path in files) == 16
    rows = json.loads(Path(files["val/worst_predictions.table.json"]).read_text())
    assert (
        rows["columns"] == ["image", "true", "predicted", "confidence", "p_true"] and len(rows["data"]) == 16
    )
    for image, true, predicted, confidence, p_true in rows["data"]:
        assert image["_type"] == "image-file" and image["width"] == 32
        assert true in CIFAR10_CLASSES and predicted in CIFAR10_CLASSES and 0.1 <= confidence <= 1
        assert 0 <= p_true <= confidence
    p_true = [row[4] for row in rows["data"]]
    assert p_true == sorted(p_true)  # worst first


def test_offline_wandb_does_not_log_checkpoints_as_artifacts(fake_cifar, tmp_path, capsys):
    # Lightning raises on log_model=True with offline=True; the CLI keeps the checkpoints on disk instead.
    config = tmp_path / "logger.yaml"
    config.write_text(
        "trainer:\n  logger:\n    - class_path: lightning.pytorch.loggers.WandbLogger\n"
        f"      init_args: {{offline: true, log_model: true, save_dir: {tmp_path}}}\n"
    )
    args = ["--config", str(CONFIGS / "cifar10.yaml"), "--config", str(config)]
    args += ["--data.data_dir", str(fake_cifar), "--trainer.default_root_dir", str(tmp_path)]
    cli = build(args)
    assert "warning: W&B is offline: checkpoints are not logged as artifacts" in capsys.readouterr().err
    (logger,) = cli.trainer.loggers
    assert logger._offline and not logger._log_model


def test_a_wandb_run_that_cannot_start_is_one_line_and_keeps_the_exit_status(
    fake_cifar, tmp_path, monkeypatch, capsys
):
    import wandb

    from project.cli import main
    from project.loggers.wandb import finish_runs
    from tests.tiny_fit import tiny_args

    def refused(**kwargs):
        raise RuntimeError(f"Traceback of wandb's service\nrun ID {kwargs['id']} is in use")

    monkeypatch.setattr(wandb, "init", refused)
    args = ["fit", "--config", str(CONFIGS / "cifar10.yaml"), *tiny_args(fake_cifar, tmp_path, logger=True)]
    with pytest.raises(SystemExit) as stop:
        main([*args, "--trainer.max_steps", "3"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" not in err
    assert re.search(
        r"error: W&B could not start run \w{8}: run ID \w{8} is in use\. To train without W&B", err
    )

    # Stopped (SIGTERM) before the run got to start: said as a warning, the stop's own status is kept.
    from project.loggers.wandb import WandbLogger

    WandbLogger(save_dir=str(tmp_path), offline=True).log_hyperparams({"lr": 0.1})
    finish_runs(143)
    assert re.search(
        r"warning: W&B could not start run \w{8}: run ID \w{8} is in use", capsys.readouterr().err
    )
