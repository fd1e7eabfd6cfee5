"""`ImageThroughputMonitor`: Lightning's ThroughputMonitor for `(images, targets)` batches, FLOPs included."""

import copy
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.utilities import rank_zero_info


def _batch_size(batch: Any) -> int:
    return len(batch[0]) if isinstance(batch, list | tuple) else len(batch)


class ImageThroughputMonitor(ThroughputMonitor):
    """Logs `train/samples_per_sec`, `train/batches_per_sec`, their per-device values and, where the device's
    peak is known (CUDA GPUs), FLOPs per second and model FLOPs utilisation (`train/device/mfu`); the same
    for validation.

    The FLOPs of one forward (validation) and forward+backward (training) pass are counted once, on the
    meta device, from the module's `example_input_array`, unless the LightningModule defines
    `flops_per_batch` itself. Lightning's monitor synchronises a CUDA device at every batch, which is why
    this callback is not on by default.

    Args:
        window_size: Number of batches the rates are averaged over.
    """

    def __init__(self, window_size: int = 100) -> None:
        super().__init__(batch_size_fn=_batch_size, window_size=window_size)
        self._flops: dict[str, float] = {}
        self._set_flops = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        example = getattr(pl_module, "example_input_array", None)
        if hasattr(type(pl_module), "flops_per_batch") or not isinstance(example, torch.Tensor):
            return
        try:
            with torch.device("meta"):
                model = copy.deepcopy(pl_module).to("meta")
                x = example[:1].to("meta")
                self._flops = {
                    "train": measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum),
                    "eval": measure_flops(model, lambda: model(x)),
                }
            self._set_flops = True
        except Exception as e:  # a network the FLOP counter cannot trace: throughput without FLOPs
            rank_zero_info(f"ImageThroughputMonitor: FLOPs not counted ({type(e).__name__}: {e})")

    # Lightning's monitor reads `pl_module.flops_per_batch` when the batch ends: set it when the batch starts.
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        self._set_batch_flops(pl_module, batch, "train")

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any
    ) -> None:
        self._set_batch_flops(pl_module, batch, "eval")

    def _set_batch_flops(self, pl_module: L.LightningModule, batch: Any, stage: str) -> None:
        if self._set_flops:
            # torch annotates Module.__setattr__ for tensors and modules only; a plain number is stored as is.
            pl_module.flops_per_batch = self._flops[stage] * _batch_size(batch)  # pyright: ignore[reportArgumentType]
