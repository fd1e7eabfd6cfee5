"""`AtomicCheckpointIO`: checkpoints that a kill at any moment cannot corrupt.

Lightning's default writer serialises the checkpoint into memory, writes it to a temporary file in the system
temp folder and moves it into place: across file systems that move is a copy, so a kill during it leaves a
truncated `last.ckpt`; and nothing is fsync'ed, so a power cut can leave an empty file behind a completed
rename. This plugin streams the checkpoint into a hidden temporary file next to the target (same file
system), fsyncs it, renames it over the target (atomic on POSIX) and fsyncs the folder. At every moment the
target is either the complete previous checkpoint or the complete new one.
"""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.strategies import Strategy
from typing_extensions import override

PARTIAL_SUFFIX = ".partial"


def partial_path(path: Path) -> Path:
    """The temporary file a checkpoint is written to before it is renamed to `path` (hidden, same folder)."""
    return path.with_name(f".{path.name}{PARTIAL_SUFFIX}")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` through a temporary file, fsync and rename: `path` is never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(
        path
    )  # one writer per target (rank 0), so a fixed name: a killed write is just replaced
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # KeyboardInterrupt too: never leave the partial file behind when we can help it
        tmp.unlink(missing_ok=True)
        raise
    # The rename lives in the folder's metadata: fsync it so the new name survives a power cut.
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's `TorchCheckpointIO` with atomic, durable local writes (temporary file, fsync, rename).

    Remote paths (`s3://...` and other fsspec URLs) keep Lightning's own writer: object stores replace whole
    objects atomically already. Loading is Lightning's (`weights_only` as given by the Trainer).
    """

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_torch_save(checkpoint, path)


def _is_local(path: _PATH) -> bool:
    return "file" in get_filesystem(path).protocol


def use_atomic_checkpoint_io(strategy: Strategy) -> None:
    """Make `strategy` write checkpoints with `AtomicCheckpointIO` unless another CheckpointIO was chosen.

    A plugin the user configured, and strategies with their own writer (XLA), are left alone.
    """
    if type(strategy).checkpoint_io is not Strategy.checkpoint_io:  # the strategy picks its own (XLA)
        return
    # The private attribute, not the property: reading the property installs Lightning's default writer.
    current = strategy._checkpoint_io
    if current is None:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif (
        isinstance(current, _WrappingCheckpointIO) and current.checkpoint_io is None
    ):  # e.g. AsyncCheckpointIO
        current.checkpoint_io = AtomicCheckpointIO()
