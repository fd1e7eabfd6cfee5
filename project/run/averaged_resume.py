"""Resuming across a change of weight averaging (EMA: configs/callbacks/ema.yaml), said in one line.

A checkpoint written with `EMAWeightAveraging` holds the average as its `state_dict` (what evaluation, export
and serving use) and the trained weights beside it (`current_model_state`). A fit without the callback would
load the average and drop the trained weights without a word: it continues from the trained weights instead,
as the run that wrote the checkpoint would have. A fit with the callback resumed from a checkpoint without an
average starts the average from the checkpoint's weights: Lightning's multi-line Python warning becomes one line.
"""

import warnings
from typing import Any

from lightning.pytorch.callbacks import WeightAveraging

from project.errors import warn

LIGHTNING_NO_AVERAGE = "The checkpoint was not created with WeightAveraging"


def reconcile_weight_average(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """Before a fit loads `checkpoint`: the trained weights for a fit without averaging; one warning line for a
    fit with averaging from a checkpoint without it. Nothing to do outside fit (the average is what is evaluated)."""
    if trainer is None or trainer.state.fn != "fit":
        return
    averaging = any(isinstance(c, WeightAveraging) for c in trainer.callbacks)
    has_average = "current_model_state" in checkpoint and "averaging_state" in checkpoint
    if has_average and not averaging:
        checkpoint["state_dict"] = checkpoint["current_model_state"]
        warn(
            f"the checkpoint {trainer.ckpt_path} holds a weight average (EMA) beside the trained weights, and this "
            "fit averages none: it continues from the trained weights (to continue the average too, add "
            "configs/callbacks/ema.yaml, as the run that wrote it had)"
        )
    elif averaging and not has_average:
        warnings.filterwarnings("ignore", message=LIGHTNING_NO_AVERAGE)
        warn(
            f"the checkpoint {trainer.ckpt_path} holds no weight average: the average (EMA) starts from its "
            "weights"
        )
