"""Small, fast training runs for the scale-out tests: a tiny fake CIFAR and the arguments that keep runs short.

The train split is exactly one global batch (32 images), so every optimizer step sees the same samples
whatever the number of processes and however the sampler orders them: runs on 1 and 2 processes can be
compared weight for weight. Augmentation is off for the same reason (it draws random numbers per process).
"""

from pathlib import Path

import yaml

from tests.conftest import CONFIGS
from tests.fakes import make_fake_cifar, patch_cifar_integrity

TRAIN_SIZE = 32  # 100 fake training images minus VAL_SIZE
VAL_SIZE = 68  # even: each of 2 processes validates exactly half, no padding


def tiny_cifar(root: Path) -> Path:
    """100 train + 20 test fake CIFAR-10 images under `root` (checksum check patched in this process)."""
    patch_cifar_integrity()
    return make_fake_cifar(root, per_batch=20, n_test=20)


def csv_logger_config(path: Path, save_dir: Path) -> Path:
    """A stackable config that logs to CSV only (no W&B process to start): metrics in save_dir/runs/version_0."""
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(save_dir)}}
    logger["init_args"]["name"] = "runs"
    path.write_text(yaml.safe_dump({"trainer": {"logger": [logger]}}))
    return path


def fit_args(data_dir: Path, root: Path, *extra: object, net: str = "SimpleCNN") -> list[str]:
    """`fit` arguments for `net` on the tiny CIFAR, without augmentation, progress bar or model summary."""
    args = [
        "fit", "--config", CONFIGS / "cifar10.yaml",
        "--model.net", net,
        "--data.data_dir", data_dir, "--data.download", "false", "--data.val_size", VAL_SIZE,
        "--data.augment.crop_padding", "0", "--data.augment.flip", "false",
        "--trainer.default_root_dir", root,
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        *extra,
    ]  # fmt: skip
    return [str(a) for a in args]
