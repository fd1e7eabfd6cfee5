"""Arguments that turn any `python -m project fit ...` command into a run of seconds on the fake CIFAR files.

The debugging and tuning tests run the documented commands with these appended (later flags win): a tiny
MLP instead of the ResNet, the fake dataset (400 training images), full precision on the CPU.
"""

import shlex
from pathlib import Path

from tests import docs_pages
from tests.conftest import ROOT

TINY_NET = ["--model.net", "project.models.MLP", "--model.net.init_args.hidden", "32"]


def tiny_args(data_dir: Path, root: Path, batch_size: int = 16, logger: bool = False) -> list[str]:
    args = [
        *TINY_NET,
        "--data.data_dir", str(data_dir), "--data.download", "false", "--data.val_size", "100",
        "--data.batch_size", str(batch_size),
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
        "--trainer.default_root_dir", str(root),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    return args if logger else [*args, "--trainer.logger", "false"]


def command_args(command: str) -> list[str]:
    """`python -m project fit --config ...` -> ["fit", "--config", "<repo>/configs/...", ...]."""
    args = shlex.split(command)[3:]
    return [str(ROOT / a) if a.startswith("configs/") else a for a in args]


def readme_commands(*folders: str) -> list[str]:
    """The `python -m project` lines of the README and the docs pages that use a config from one of `folders`
    (e.g. configs/debug/)."""
    return docs_pages.cli_commands(*folders)
