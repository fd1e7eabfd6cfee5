"""Start-up checks of the LightningModule's settings: a bad value fails before any data is read or file written."""

from typing import Any

import torch
from torch import nn

from project.errors import UserError


def check_optimizer(factory: Any, key: str = "model.optimizer") -> None:
    """Build the optimizer once on a dummy parameter, so that a setting it rejects (a negative learning rate,
    betas outside [0, 1), a negative weight decay) fails at start-up with one line naming `key`, instead of
    after the data is loaded, inside `fit`."""
    try:
        factory([nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as e:
        name = getattr(getattr(factory, "func", None), "__name__", None) or getattr(factory, "__name__", "")
        raise UserError(f"{key} {_class_name(factory) or name}: {e}") from None


def _class_name(factory: Any) -> str:
    """The optimizer class behind a jsonargparse/functools partial, for the message."""
    for arg in (*getattr(factory, "args", ()), factory):
        if isinstance(arg, type):
            return arg.__name__
    return ""
