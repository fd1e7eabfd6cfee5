"""In-process training runs of seconds for the callback tests: a small SimpleCNN on the fake CIFAR files."""

import csv
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from project.data import CIFARDataModule
from project.models import SimpleCNN
from project.tasks import ImageClassifier

NET = {"width": 8, "hidden": 32}


def make_model(**kwargs: Any) -> ImageClassifier:
    optimizer = partial(torch.optim.AdamW, lr=3e-3)
    return ImageClassifier(SimpleCNN(**{**NET, **kwargs}), num_classes=10, optimizer=optimizer)


def make_data(data_dir: Path, batch_size: int = 50) -> CIFARDataModule:
    return CIFARDataModule(data_dir=str(data_dir), download=False, val_size=100, batch_size=batch_size)


def make_trainer(root: Path, callbacks: list, max_epochs: int = 3, **kwargs: Any) -> L.Trainer:
    """CPU trainer logging every step to `root/metrics.csv`, keeping `root/checkpoints/last.ckpt`."""
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)
    defaults = {
        "accelerator": "cpu",
        "max_epochs": max_epochs,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": L.pytorch.loggers.CSVLogger(root, name="", version=""),
        "default_root_dir": root,
    }
    return L.Trainer(callbacks=[*callbacks, checkpoint], **{**defaults, **kwargs})


def read_metrics(root: Path) -> list[dict[str, str]]:
    with open(root / "metrics.csv") as f:
        return list(csv.DictReader(f))


def epoch_values(rows: list[dict[str, str]], key: str) -> dict[int, float]:
    """{epoch: value} of a metric logged once per epoch."""
    return {int(r["epoch"]): float(r[key]) for r in rows if r.get(key)}
