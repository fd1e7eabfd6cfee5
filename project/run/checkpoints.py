"""Checkpoints that a kill cannot corrupt, and that are read back safely.

Writing: Lightning's default writer serialises into memory, writes a temporary file in the system temp folder
and moves it into place; across file systems that move is a copy (a kill during it truncates `last.ckpt`), and
nothing is fsync'ed. `AtomicCheckpointIO` streams the checkpoint through `project.atomic_files.atomic_path` instead: a
temporary file beside the target, fsync, rename. A full disk is reported as such, and the previous checkpoint
stays as it was.

Reading: a checkpoint is a pickle, and unpickling arbitrary objects can run arbitrary code. `load_checkpoint`
reads with `weights_only=True` (tensors and plain values only) and names the file and the problem in one line.
"""

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from torch import nn

from project.atomic_files import atomic_path, is_disk_full, no_space_left
from project.errors import UserError


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """`torch.save(obj, path)` through a temporary file, fsync and rename: `path` is never half-written."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(obj, f)
    except (OSError, RuntimeError) as e:
        if not is_disk_full(e):
            raise
        raise UserError(
            no_space_left(
                f"the checkpoint {path}",
                "the previous checkpoint there is intact",
                "Free some space, then resume with the same command plus --ckpt_path last",
            )
        ) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's `TorchCheckpointIO` with atomic, durable local writes (temporary file, fsync, rename).

    Remote paths (`s3://...` and other fsspec URLs) keep Lightning's own writer: object stores replace whole
    objects atomically already. Loading is Lightning's (`weights_only` as given by the Trainer).
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or "file" not in get_filesystem(path).protocol:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_torch_save(checkpoint, path)


def with_atomic_checkpoint_io(plugins: Any) -> list[Any]:
    """The Trainer's `plugins` with `AtomicCheckpointIO` as the checkpoint writer, unless one was chosen.

    A CheckpointIO the user configured is kept; an `AsyncCheckpointIO` without a writer of its own gets the
    atomic one underneath.
    """
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    chosen = [p for p in plugins if isinstance(p, CheckpointIO)]
    if not chosen:
        return [*plugins, AtomicCheckpointIO()]
    for plugin in chosen:
        if isinstance(plugin, AsyncCheckpointIO) and plugin.checkpoint_io is None:
            plugin.checkpoint_io = AtomicCheckpointIO()
    return plugins


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a Lightning checkpoint with `torch.load(weights_only=True)` onto the CPU.

    Raises UserError naming the file when it does not exist, is not a checkpoint, or holds objects other
    than tensors and plain values (refused: loading them could execute code).
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(f.name for f in path.glob("*.ckpt"))
        inside = f" (in it: {', '.join(found[:5])}{', ...' if len(found) > 5 else ''})" if found else ""
        raise UserError(
            f"checkpoint {path} is a folder: give a .ckpt file{inside}, or `last`/`best` for the run's own"
        )
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    # torch.save writes a zip archive (the legacy format starts with a pickle protocol byte). Anything else
    # (a YAML, an image) would otherwise be reported by the weights-only unpickler as holding unsafe objects.
    with open(path, "rb") as f:
        head = f.read(1)
    if not zipfile.is_zipfile(path) and head != b"\x80":
        raise UserError(f"{path} is not a PyTorch checkpoint (truncated, or a file of another kind)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" in str(e):
            reason = str(e).split("\n\n")[-1].splitlines()[0] if "\n" in str(e) else str(e)
            raise UserError(
                f"refusing to load {path}: it contains objects other than tensors and plain values, and "
                f"unpickling them could run arbitrary code (loaded with weights_only=True). {reason}"
            ) from None
        raise UserError(f"{path} is not a PyTorch checkpoint ({e})") from None
    except Exception as e:  # zip, EOF, legacy-pickle and key errors: all mean "not a checkpoint"
        raise UserError(
            f"{path} is not a readable PyTorch checkpoint (truncated or another format): {e}"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"{path} is not a Lightning checkpoint: it has no 'state_dict'")
    return checkpoint


def weight_shapes(state_dict: Mapping[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """Each key's tensor shape (None for a value without one): what `check_fits` compares."""
    return {k: tuple(v.shape) if hasattr(v, "shape") else None for k, v in state_dict.items()}


def check_fits(
    module: nn.Module, shapes: Mapping[str, tuple[int, ...] | None], source: str = "checkpoint"
) -> None:
    """A UserError listing every key and shape by which `shapes` (a state_dict's) does not fit `module`."""
    own = weight_shapes(module.state_dict())
    missing = [k for k in own if k not in shapes]
    unexpected = [k for k in shapes if k not in own]
    mismatched = [
        f"{k}: {shapes[k]} in the checkpoint, {own[k]} in the network"
        for k in own
        if k in shapes and shapes[k] is not None and shapes[k] != own[k]
    ]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append(f"{len(mismatched)} shape mismatch(es): " + "; ".join(mismatched[:10]))
        if missing:
            parts.append(f"{len(missing)} key(s) missing from the checkpoint: " + ", ".join(missing[:10]))
        if unexpected:
            parts.append(
                f"{len(unexpected)} unexpected key(s) in the checkpoint: " + ", ".join(unexpected[:10])
            )
        raise UserError(
            f"{source} does not fit the network ({type(module).__name__}): {' | '.join(parts)}. "
            "Was it trained with another --model.net, or data with another number of classes?"
        )


def load_weights(
    module: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint"
) -> None:
    """`module.load_state_dict(state_dict)`, with one message listing every mismatched key and shape."""
    check_fits(module, weight_shapes(state_dict), source)
    module.load_state_dict(state_dict)
