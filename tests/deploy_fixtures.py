"""A small trained run shared by the export, quantize, predict_onnx and serve tests, and its exports.

`fit` runs once per test session (a SimpleCNN on fake CIFAR, whose classes differ by colour, so a few
epochs reach high accuracy and INT8 results are comparable); so do its ONNX export and its AOTInductor package
(a C++ compiler runs: the package is compiled once and shared). A test module takes them with
`pytest_plugins = ["tests.deploy_fixtures"]`.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, newest_run, run_cli
from tests.deploy_helpers import mounted_tmpfs


@dataclass
class TrainedRun:
    root: Path
    ckpt: Path
    config: Path
    data_dir: Path

    @property
    def data_args(self) -> list[str]:
        return ["--data.init_args.data_dir", str(self.data_dir)]


@pytest.fixture(scope="session")
def trained_run(fake_cifar, tmp_path_factory) -> TrainedRun:
    root = tmp_path_factory.mktemp("deploy_run")
    run_cli(
        "fit",
        "--config", CONFIGS / "cifar10.yaml", "--config", CONFIGS / "debug.yaml",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "8", "--model.net.init_args.hidden", "32",
        "--model.optimizer", "AdamW", "--model.optimizer.init_args.lr", "0.01", "--model.scheduler", "null",
        "--data.data_dir", fake_cifar, "--data.download", "false", "--data.val_size", "100",
        "--data.batch_size", "50", "--trainer.max_epochs", "10", "--trainer.limit_train_batches", "8",
        "--trainer.limit_val_batches", "2", "--trainer.check_val_every_n_epoch", "5",
        "--trainer.default_root_dir", root,
        cwd=root, timeout=900,
    )  # fmt: skip
    run = newest_run(root)
    return TrainedRun(
        root=run, ckpt=run / "checkpoints" / "last.ckpt", config=run / "config.yaml", data_dir=fake_cifar
    )


@pytest.fixture(scope="session")
def exported(trained_run, tmp_path_factory) -> Path:
    """model.onnx + model.json of the trained run (exported in-process)."""
    from project.export.model_export import export

    out = tmp_path_factory.mktemp("deploy_export")
    export(str(trained_run.ckpt), format="onnx", output_dir=str(out))
    return out / "model.onnx"


@pytest.fixture(scope="session")
def exported_aoti(trained_run, tmp_path_factory) -> Path:
    """model.pt2 (an AOTInductor package for the CPU) + model.json of the trained run (exported in-process)."""
    from project.export.model_export import export

    out = tmp_path_factory.mktemp("deploy_aoti")
    export(str(trained_run.ckpt), format="aoti", output_dir=str(out))
    return out / "model.pt2"


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A 64 KiB disk: room for a staging folder, not for a model; the first model written finds it full."""
    with mounted_tmpfs(tmp_path / "disk", 64 * 1024) as disk:
        yield disk
