"""Exact distributed evaluation: over several processes every image counts exactly once.

Each process evaluates its own whole batches (no padding with repeated images), so `validate` of one
checkpoint gives the same val/acc and val/loss on 1 process and on 2 gloo processes, to the last digit.
"""

import csv
import socket
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_cli
from tests.tiny_runs import csv_logger_config

VAL_SIZE = 153  # odd: a sampler that pads gives one process a repeated image


def args(command: str, data: Path, root: Path, *extra: object) -> list[str]:
    # Batches of 80: one process sees [0, 80) and [80, 153); with two, each takes one of these two batches, and
    # the loss sum over them is one addition either way (exactly the same float).
    args = [
        command, "--config", CONFIGS / "cifar10.yaml",
        "--model.net", "project.models.SimpleCNN", "--model.net.init_args.width", "8",
        "--data.data_dir", data, "--data.download", "false", "--data.val_size", VAL_SIZE,
        "--data.batch_size", "80", "--trainer.precision", "32-true",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", root, *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


def val_row(save_dir: Path) -> dict[str, str]:
    (metrics,) = save_dir.glob("runs/version_*/metrics.csv")
    with open(metrics) as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("val/acc")]
    return {k: v for k, v in row.items() if k in ("val/acc", "val/loss")}


@pytest.mark.slow
def test_validate_on_two_processes_gives_the_one_process_metrics(fake_cifar, tmp_path, monkeypatch):
    # One thread per process in both runs (Lightning splits the CPUs among DDP processes): a convolution sums in
    # another order on another number of threads, which changes a loss in its last bit.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # A port of its own: another test's processes starting at the same moment could pick the same free port,
    # and each group would wait for processes of the other.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.logger", "false"]
    run_cli(*args("fit", fake_cifar, tmp_path / "fit", *fit), cwd=tmp_path)
    (ckpt,) = (tmp_path / "fit").glob("runs/version_0/checkpoints/last.ckpt")

    rows = []
    for name, extra in (("one", ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]),
                        ("two", ["--config", CONFIGS / "trainer" / "ddp_cpu.yaml"])):  # fmt: skip
        logger = csv_logger_config(tmp_path / f"{name}.yaml", tmp_path / name)
        command = args(
            "validate", fake_cifar, tmp_path / name, *extra, "--config", logger, "--ckpt_path", ckpt
        )
        run_cli(*command, cwd=tmp_path)
        rows.append(val_row(tmp_path / name))
    one, two = rows
    assert one.keys() == {"val/acc", "val/loss"} and one == two
    # Accuracy is a count over the 153 images, not over 154 with one of them twice.
    assert float(one["val/acc"]) * VAL_SIZE == pytest.approx(
        round(float(one["val/acc"]) * VAL_SIZE), abs=1e-3
    )
