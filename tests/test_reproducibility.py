"""Reproducibility: same seed -> bit-identical weights and metrics, from the command line, from the saved config,
and across a stop and `--ckpt_path last` resume at an epoch boundary; with several data-loading workers that
draw random augmentations (TrivialAugment runs per image in the workers)."""

import csv
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import CONFIGS
from tests.test_kill_resume import start

pytestmark = pytest.mark.slow


def args(data: Path, root: Path, epochs: int, *extra: str) -> list:
    return [
        "fit", "--config", CONFIGS / "cifar10.yaml",
        "--model.net", "project.models.SimpleCNN",
        "--model.optimizer", "AdamW", "--model.optimizer.init_args.lr", "0.002",
        "--model.scheduler", "torch.optim.lr_scheduler.StepLR", "--model.scheduler.init_args.step_size", "1",
        "--model.scheduler.init_args.gamma", "0.5",
        "--data.data_dir", data, "--data.download", "false", "--data.val_size", "100", "--data.batch_size", "50",
        "--data.num_workers", "2", "--data.augment.trivial_augment", "true", "--data.persistent_workers", "false",
        "--trainer.precision", "32-true", "--trainer.deterministic", "true", "--trainer.max_epochs", epochs,
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", root, *extra,
    ]  # fmt: skip


def finish(proc) -> None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def val_metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return [
            {k: v for k, v in r.items() if k.startswith("val/")} | {"epoch": r["epoch"]}
            for r in csv.DictReader(f)
            if r["val/loss"]
        ]


def assert_identical(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"weights differ between {a} and {b}: {different}"
    assert val_metrics(a) == val_metrics(b)


def test_same_seed_same_bits_from_args_saved_config_and_resume(fake_cifar, tmp_path):
    first = tmp_path / "a" / "runs" / "version_0"
    # An uninterrupted 2-epoch run, and the same run stopped after epoch 1 (started in parallel).
    procs = [
        start(args(fake_cifar, tmp_path / "a", 2), tmp_path),
        start(args(fake_cifar, tmp_path / "c", 1), tmp_path),
    ]
    for proc in procs:
        finish(proc)

    # The run's record is enough to rerun it: its saved config (+ the recorded code and package versions).
    info = json.loads((first / "run_info.json").read_text())[0]
    assert (
        info["git_commit"]
        and info["key_packages"]["torch"] == torch.__version__
        and info["packages"]["lightning"]
    )
    rerun = start(
        ["fit", "--config", first / "config.yaml", "--trainer.default_root_dir", tmp_path / "b"], tmp_path
    )
    resumed = start(args(fake_cifar, tmp_path / "c", 2, "--ckpt_path", "last"), tmp_path)
    for proc in (rerun, resumed):
        finish(proc)

    # The saved config is the config as given (loggers at the default folder, which follows
    # trainer.default_root_dir): the rerun is a run of its own, under the root it was given.
    assert_identical(first, tmp_path / "b" / "runs" / "version_0")
    assert_identical(first, tmp_path / "c" / "runs" / "version_0")
    assert len(val_metrics(first)) == 2
