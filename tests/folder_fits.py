"""Tiny image folders and the `fit` flags that train on them in seconds: what the core's tests and every part's
tests share (a part's own test helpers build on these)."""

from pathlib import Path

from tests.conftest import CONFIGS
from tests.fakes import make_image_folder


def tiny_folder(root: Path, per_class: int = 9, test: bool = False) -> Path:
    """`root/train/<c0..c2>/*` (or `root/<class>` without `test`), plus `root/test` with `test`."""
    make_image_folder(root / "train" if test else root, classes=3, per_class=per_class, extras=False)
    if test:
        make_image_folder(root / "test", classes=3, per_class=4, seed=1, extras=False)
    return root


def tiny_fit_args(data: Path, root: Path, *extra: object) -> list[str]:
    """`fit` flags for configs/folder.yaml that train a 4-channel SimpleCNN on 16-pixel images in seconds."""
    args = [
        "--config", CONFIGS / "folder.yaml", "--data.root", data, "--data.cache_dir", root / "cache",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "4", "--model.net.init_args.hidden", "16",
        "--data.image_size", "16", "--data.batch_size", "8", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", root / "logs", *extra,
    ]  # fmt: skip
    return [str(a) for a in args]
