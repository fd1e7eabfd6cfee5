"""`model.init_from`: a new fit that starts from the weights of another run's checkpoint.

Resuming (`--ckpt_path`) continues a run: the same classes, its optimizer, schedule and step. Fine-tuning a
trained network onto other data, other classes included, is this separate, explicit setting: every tensor of
the network is loaded from the checkpoint except the output layer when the classes differ (it starts new, sized
for the data's classes); optimizer, schedule and step start afresh. The checkpoint must otherwise fit the
network: one of another architecture is refused, naming what does not fit.
"""

from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_only
from torch import nn

from project.errors import UserError
from project.run.checkpoints import load_checkpoint
from project.run.data_identity import recorded_names

SHOWN = 5  # tensor names listed in a message


def output_layer_keys(net: nn.Module, prefix: str = "net.") -> set[str]:
    """The state_dict keys (with `prefix`) of the network's output layer: the head the network names
    (`head_parameter_names`, relative to the network), else its last linear (or, without one, conv) layer."""
    if hasattr(net, "head_parameter_names"):
        return {f"{prefix}{name}" for name in net.head_parameter_names()}  # type: ignore[operator]
    layers = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    layers = layers or [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Conv2d)]
    if not layers:
        return set()
    name, layer = layers[-1]
    return {f"{prefix}{name}.{key}" for key in layer.state_dict()}


def load_matching_weights(task: Any, path: str | Path) -> None:
    """Load the checkpoint `path` into `task` (an ImageTask): all of its network but the output layer when the
    checkpoint's classes differ from the task's. A UserError when any other tensor is missing or mismatched."""
    checkpoint = load_checkpoint(path)
    state = checkpoint["state_dict"]
    own = task.state_dict()
    recorded = recorded_names(checkpoint)
    same_classes = recorded is not None and recorded[1] == list(task.class_names)
    head = set() if same_classes else output_layer_keys(task.net)
    wanted = [k for k in own if k not in head]
    fits = {
        k: state[k]
        for k in wanted
        if k in state and getattr(state[k], "shape", None) == getattr(own[k], "shape", None)
    }
    not_fitting = [k for k in wanted if k not in fits]
    if not_fitting:
        shown = ", ".join(
            f"{k} ({_shape(state.get(k))} there, {_shape(own[k])} here)" for k in not_fitting[:SHOWN]
        )
        raise UserError(
            f"model.init_from {path}: {len(not_fitting)} of the network's {len(wanted)} tensors (besides the "
            f"output layer) are missing from it or of another shape: {shown}"
            f"{', ...' if len(not_fitting) > SHOWN else ''}. Was it trained with another --model.net?"
        )
    task.load_state_dict(fits, strict=False)
    new_head = " (the output layer starts new: the classes differ)" if head else ""
    rank_zero_only(print)(f"model.init_from {path}: {len(fits)} tensors loaded{new_head}")


def _shape(value: Any) -> str:
    if value is None:
        return "missing"
    return str(tuple(value.shape)) if hasattr(value, "shape") else type(value).__name__
