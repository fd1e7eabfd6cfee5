"""Optimizer and scheduler factories from the config: what they build, a bad setting caught at start-up, and
the parameter groups the optimizer gets.

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


_NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)


def param_groups(model: nn.Module, decay_norm_and_bias: bool = False) -> list[dict[str, Any]]:
    """The trainable parameters for the optimizer, biases and norm scales/offsets without weight decay
    (decaying them only hurts: they set scale and offset, not capacity) unless `decay_norm_and_bias`."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_norm_and_bias:
        return [{"params": params}]
    # Found by the module that owns them rather than by shape: FSDP (v1) hands the optimizer every parameter
    # as a flat 1-D shard.
    exempt = {
        id(p)
        for m in model.modules()
        for name, p in m.named_parameters(recurse=False)
        if name == "bias" or isinstance(m, _NORM_LAYERS)
    }
    decay = [p for p in params if id(p) not in exempt]
    no_decay = [p for p in params if id(p) in exempt]
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
