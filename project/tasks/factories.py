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


def _pretrained_net(model: nn.Module) -> Any:
    """The outermost module that says which of its parameters are its head (`head_parameter_names`), or None:
    the network inside the task (and inside a DDP or FSDP2 wrapper), found by what it can do."""
    return next((m for m in model.modules() if callable(getattr(m, "head_parameter_names", None))), None)


def lr_scales(model: nn.Module, backbone_lr_scale: float = 1.0, layer_decay: float = 1.0) -> dict[int, float]:
    """Each parameter's learning-rate multiplier (by `id`), for fine-tuning a pretrained network: the backbone's
    parameters `backbone_lr_scale` (the new head keeps the full rate), and each layer `layer_decay` times the
    one above it (BEiT's layer-wise decay, with the depths the network gives in `layer_ids`). Parameters not
    listed are at 1."""
    if backbone_lr_scale == 1.0 and layer_decay == 1.0:
        return {}
    net = _pretrained_net(model)
    if net is None:
        setting = "backbone_lr_scale" if backbone_lr_scale != 1.0 else "layer_decay"
        raise UserError(
            f"model.{setting} needs a network that says which parameters are its head "
            f"(head_parameter_names(): TimmNet, TorchvisionNet); {type(model).__name__}'s network does not"
        )
    named = dict(net.named_parameters())
    head = set(net.head_parameter_names())
    depth: dict[str, int] = {}
    if layer_decay != 1.0:
        depth = net.layer_ids() if hasattr(net, "layer_ids") else {}
        if not depth:
            raise UserError(
                f"model.layer_decay needs a network that gives its layers' depths (layer_ids(): TimmNet); "
                f"{type(net).__name__} does not"
            )
    top = max(depth.values(), default=0)
    scales: dict[int, float] = {}
    for name, p in named.items():
        scale = 1.0 if name in head else backbone_lr_scale
        scales[id(p)] = scale * layer_decay ** (top - depth.get(name, top))
    return scales


def param_groups(
    model: nn.Module,
    decay_norm_and_bias: bool = False,
    norm_bias_lr_scale: float = 1.0,
    backbone_lr_scale: float = 1.0,
    layer_decay: float = 1.0,
) -> list[dict[str, Any]]:
    """The trainable parameters for the optimizer, biases and norm scales/offsets without weight decay
    (decaying them only hurts: they set scale and offset, not capacity) unless `decay_norm_and_bias`.

    With a `norm_bias_lr_scale` other than 1 the norm layers' biases get a third group, marked `lr_scale` and
    `weight_decay_scale` (its inverse, which keeps their decay per step; `build_optimizer` applies both). With a
    `backbone_lr_scale` or `layer_decay` other than 1 (`lr_scales`), each of those groups is split by learning
    rate, marked `lr_scale` too; their weight decay is unchanged (it shrinks with the learning rate, as in timm)."""
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
    scales = lr_scales(model, backbone_lr_scale, layer_decay)

    def pick(k: str, scale: float = 1.0) -> list[nn.Parameter]:
        return [p for p in params if kind.get(id(p), "decay") == k and scales.get(id(p), 1.0) == scale]

    exempt = {} if decay_norm_and_bias else {"weight_decay": 0.0}
    settings: dict[str, dict[str, Any]] = {"decay": {}, "exempt": exempt}
    if norm_bias_lr_scale != 1.0:
        settings["scaled"] = {"lr_scale": norm_bias_lr_scale, "weight_decay_scale": 1 / norm_bias_lr_scale}
        settings["scaled"] |= exempt
    # Without scales this is one group per kind, each there even when empty (as before any scaling).
    groups = [{"params": pick(k), **s} for k, s in settings.items()]
    for scale in sorted(set(scales.values()) - {1.0}, reverse=True):
        for k, s in settings.items():
            if chosen := pick(k, scale):
                groups.append({"params": chosen, **s, "lr_scale": s.get("lr_scale", 1.0) * scale})
    return groups


def build_optimizer(
    factory: Any,
    model: nn.Module,
    decay_norm_and_bias: bool = False,
    norm_bias_lr_scale: float = 1.0,
    backbone_lr_scale: float = 1.0,
    layer_decay: float = 1.0,
) -> torch.optim.Optimizer:
    """The optimizer over `param_groups(model, ...)`, each group's learning rate multiplied by its `lr_scale`
    and its weight decay by its `weight_decay_scale`: the norm biases' decay is divided by their scale, so that
    their decay per step (lr x weight_decay, for coupled decay) stays what the config says (airbench's BatchNorm
    biases)."""
    groups = param_groups(model, decay_norm_and_bias, norm_bias_lr_scale, backbone_lr_scale, layer_decay)
    optimizer = factory(groups)
    for group in optimizer.param_groups:
        group["lr"] *= group.get("lr_scale", 1.0)
        if group.get("weight_decay"):
            group["weight_decay"] *= group.get("weight_decay_scale", 1.0)
    return optimizer


def scaled_max_lr(scheduler: Any, optimizer: torch.optim.Optimizer) -> list[float] | None:
    """OneCycle-style schedules set every group's rate from `max_lr`: one per group, scaled by its
    `lr_scale`, keeps the scaling. None when no group is scaled or the config gives a list already."""
    max_lr = getattr(scheduler, "keywords", {}).get("max_lr")
    if not takes_argument(scheduler, "max_lr") or not isinstance(max_lr, int | float):
        return None
    scales = [group.get("lr_scale", 1.0) for group in optimizer.param_groups]
    return [max_lr * s for s in scales] if any(s != 1.0 for s in scales) else None
