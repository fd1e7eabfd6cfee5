"""Optimizer and scheduler factories from the config: what they build, and a bad setting caught at start-up.

jsonargparse turns `optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}}` into a partial that builds
the optimizer once the parameters exist; a hand-written `functools.partial(cls, ...)` works the same here.
"""

import inspect
from typing import Any

import torch
from torch import nn

from project.errors import UserError


def built_class(factory: Any) -> type | None:
    """The class a factory builds (jsonargparse's partial carries it among its arguments), or None."""
    candidates = [factory, getattr(factory, "func", None), *getattr(factory, "args", ())]
    return next((c for c in candidates if inspect.isclass(c)), None)


def takes_argument(factory: Any, name: str) -> bool:
    """Whether the class the factory builds takes the argument `name` (OneCycleLR's `max_lr`, `total_steps`)."""
    cls = built_class(factory)
    return cls is not None and name in inspect.signature(cls).parameters


def leaves_unset(factory: Any, name: str) -> bool:
    """Whether the class takes `name` and the config left it unset (None), for the module to fill in."""
    return takes_argument(factory, name) and getattr(factory, "keywords", {}).get(name) is None


def check_optimizer(factory: Any, key: str = "model.optimizer") -> None:
    """Build the optimizer once on a dummy parameter, so that a setting it rejects (a negative learning rate,
    betas outside [0, 1), a negative weight decay) fails at start-up with one line naming `key`, instead of
    after the data is loaded, inside `fit`."""
    try:
        factory([nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as e:
        cls = built_class(factory)
        name = cls.__name__ if cls else getattr(factory, "__name__", "")
        raise UserError(f"{key} {name}: {e}") from None
