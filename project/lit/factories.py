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


def param_groups(
    model: nn.Module, decay_norm_and_bias: bool = False, norm_bias_lr_scale: float = 1.0
) -> list[dict[str, Any]]:
    """The trainable parameters for the optimizer, biases and norm scales/offsets without weight decay
    (decaying them only hurts: they set scale and offset, not capacity) unless `decay_norm_and_bias`.

    With a `norm_bias_lr_scale` other than 1 the norm layers' biases get a third group, marked `lr_scale`
    (which `build_optimizer` applies)."""
    # Found by the module that owns them rather than by shape: FSDP (v1) hands the optimizer every parameter
    # as a flat 1-D shard.
    kind: dict[int, str] = {}
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            norm = isinstance(m, _NORM_LAYERS)
            if norm and name == "bias" and norm_bias_lr_scale != 1.0:
                kind[id(p)] = "scaled"
            elif norm or name == "bias":
                kind[id(p)] = "exempt"
    params = [p for p in model.parameters() if p.requires_grad]

    def pick(k: str) -> list[nn.Parameter]:
        return [p for p in params if kind.get(id(p), "decay") == k]

    exempt = {} if decay_norm_and_bias else {"weight_decay": 0.0}
    groups = [{"params": pick("decay")}, {"params": pick("exempt"), **exempt}]
    if norm_bias_lr_scale != 1.0:
        groups.append({"params": pick("scaled"), "lr_scale": norm_bias_lr_scale, **exempt})
    return groups


def build_optimizer(
    factory: Any, model: nn.Module, decay_norm_and_bias: bool = False, norm_bias_lr_scale: float = 1.0
) -> torch.optim.Optimizer:
    """The optimizer over `param_groups(model, ...)`, each group's learning rate multiplied by its `lr_scale`
    and its weight decay divided by it, so that the decay per step (lr x weight_decay, for coupled decay)
    stays what the config says (airbench's BatchNorm biases)."""
    optimizer = factory(param_groups(model, decay_norm_and_bias, norm_bias_lr_scale))
    for group in optimizer.param_groups:
        scale = group.get("lr_scale", 1.0)
        group["lr"] *= scale
        if group.get("weight_decay"):
            group["weight_decay"] /= scale
    return optimizer


def scaled_max_lr(scheduler: Any, optimizer: torch.optim.Optimizer) -> list[float] | None:
    """OneCycle-style schedules set every group's rate from `max_lr`: one per group, scaled by its
    `lr_scale`, keeps the scaling. None when no group is scaled or the config gives a list already."""
    max_lr = getattr(scheduler, "keywords", {}).get("max_lr")
    if not takes_argument(scheduler, "max_lr") or not isinstance(max_lr, int | float):
        return None
    scales = [group.get("lr_scale", 1.0) for group in optimizer.param_groups]
    return [max_lr * s for s in scales] if any(s != 1.0 for s in scales) else None
