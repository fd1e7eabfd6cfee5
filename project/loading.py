"""Loading checkpoints safely: tensors and plain values only (`weights_only=True`), and clear errors.

Every tool command that reads a checkpoint (export, quantize, serve, ...) goes through `load_checkpoint`
and `load_weights`: a checkpoint is a pickle, and unpickling arbitrary objects can run arbitrary code.
"""

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.errors import UserError


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a Lightning checkpoint with `torch.load(weights_only=True)` onto the CPU.

    Raises UserError naming the file when it does not exist, is not a checkpoint, or holds objects other
    than tensors and plain values (refused: loading them could execute code).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    # torch.save writes a zip archive (the legacy format starts with a pickle protocol byte). Anything else
    # (a YAML, an image, an empty file) would otherwise surface as a puzzling unpickling error.
    with open(path, "rb") as f:
        head = f.read(1)
    if not zipfile.is_zipfile(path) and head != b"\x80":
        raise UserError(f"{path} is not a PyTorch checkpoint (neither a torch.save zip archive nor a pickle)")
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


def load_weights(
    module: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint"
) -> None:
    """`module.load_state_dict(state_dict)`, with one message listing every mismatched key and shape."""
    own = module.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [
        f"{k}: {tuple(state_dict[k].shape)} in the checkpoint, {tuple(own[k].shape)} in the network"
        for k in own
        if k in state_dict and hasattr(state_dict[k], "shape") and state_dict[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if shapes:
            parts.append(f"{len(shapes)} shape mismatch(es): " + "; ".join(shapes[:10]))
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
    module.load_state_dict(state_dict)
