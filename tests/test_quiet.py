"""Quiet by default: what a default `fit`, `test` and `predict` of configs/folder.yaml print on a flat class folder
(W&B offline, as shipped), and what installing the project prints."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, PACKAGE, ROOT, newest_run, subprocess_env
from tests.fakes import make_image_folder

WANDB_LINE = re.compile(r"^W&B run [a-z0-9]+ logged offline; to upload it: wandb sync (\S+)$", re.M)
NO_TEST_SPLIT = "warning: the data has no test split: testing on the validation split"


def project_command(*args: object, cwd: Path) -> str:
    """What `python -m project <args>` prints (stdout and stderr), run as a user runs it: W&B as the config
    says (offline), not silenced as the other tests' W&B is."""
    env = {k: v for k, v in subprocess_env().items() if k not in ("WANDB_MODE", "WANDB_SILENT")}
    command = [sys.executable, "-m", "project", *map(str, args)]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    """What fit (one epoch), then test and predict with its best checkpoint print; run from their own folder."""
    cwd = tmp_path_factory.mktemp("quiet")
    images = make_image_folder(cwd / "images", extras=False)  # flat: root/<class>/*, no test split
    data = ["--config", CONFIGS / "folder.yaml", "--data.root", images, "--data.cache_dir", cwd / "cache"]
    out = {"fit": project_command("fit", *data, "--trainer.max_epochs", "1", cwd=cwd)}
    (best,) = [p for p in (newest_run(cwd / "logs") / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt"]
    for command in ("test", "predict"):
        out[command] = project_command(command, *data, "--ckpt_path", best, cwd=cwd)
    out["cwd"] = str(cwd)
    return out


@pytest.mark.slow
def test_the_model_summary_lists_the_network_without_metric_objects(printed):
    fit = printed["fit"]
    assert re.search(r"\bnet\b.*\bTorchvisionNet\b", fit) and re.search(r"\bnet\.net\b.*\bResNet\b", fit)
    for metric in (
        "MetricCollection",
        "MulticlassAccuracy",
        "MeanMetric",
        "MaxMetric",
        "val_best",
        "_metrics",
    ):
        assert metric not in fit


@pytest.mark.slow
def test_no_logging_interval_warning_on_a_short_epoch(printed):
    # One batch an epoch, under log_every_n_steps=50: Lightning would warn, with its own file's path.
    assert "log_every_n_steps" not in printed["fit"]
    assert "site-packages" not in printed["fit"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["fit", "test", "predict"])
def test_an_offline_wandb_run_is_one_line_saying_where_it_is(printed, command):
    out = printed[command]
    assert not [line for line in out.splitlines() if line.startswith("wandb:")]
    (where,) = WANDB_LINE.findall(out)
    assert where.startswith("logs/wandb/offline-run-") and list(
        (Path(printed["cwd"]) / where).glob("*.wandb")
    )


@pytest.mark.slow
def test_testing_without_a_test_split_says_in_one_line_which_split_it_scored(printed):
    out = printed["test"]
    (line,) = [line for line in out.splitlines() if "test split" in line]
    assert line.startswith(NO_TEST_SPLIT) and "root/test/" in line
    assert "UserWarning" not in out and "labelled_files.py" not in out


def test_an_editable_install_does_not_warn_about_folders_named_like_the_package(tmp_path):
    # What `make install` runs for the project itself, on a copy of it, into a prefix of its own.
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / PACKAGE, copy / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", copy]
    # --ignore-installed: with --prefix alone pip first uninstalls the project from the environment running
    # the tests.
    proc = subprocess.run(
        [*map(str, command), "--prefix", str(tmp_path / "prefix"), "--ignore-installed"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same name" not in proc.stdout + proc.stderr and "Warning" not in proc.stdout + proc.stderr
    (pth,) = (tmp_path / "prefix").glob(f"lib/python*/site-packages/__editable__.{PACKAGE}-*.pth")
    assert pth.read_text().split() == [
        str(copy)
    ]  # the checkout's root on sys.path: `import project` finds it
