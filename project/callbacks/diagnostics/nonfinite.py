"""`NonFiniteGuard`: stop at the first NaN/inf loss or gradient, say where, and save nothing broken."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from project.errors import UserError


class NonFiniteError(UserError):
    """Training produced a NaN or infinite loss, gradient or weight."""


class NonFiniteGuard(Callback):
    """Stops training when the loss or a gradient is NaN or infinite, before the optimizer step applies it.

    The message names the global step, epoch and batch, and the first layer (in module order) with a
    non-finite gradient, which is usually where the problem starts. The broken update is never applied, and
    a checkpoint is refused if the weights themselves became non-finite, so no checkpoint of a broken state
    is written. With a float16 gradient scaler (`precision: 16-mixed` on a GPU), infinite gradients are normal
    (the scaler skips the step and lowers its scale): then only the loss is checked.

    Costs one device synchronisation every `every_n_steps` batches.

    Args:
        every_n_steps: Check every this many batches (1: every batch).
    """

    def __init__(self, every_n_steps: int = 1) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"NonFiniteGuard.every_n_steps must be at least 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._loss: Tensor | None = None
        self._batches = 0  # training batches seen in this fit
        self._batch_idx = 0  # the current batch's index in its epoch

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx
        self._batches += 1

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        self._loss = loss.detach() if (self._batches - 1) % self.every_n_steps == 0 else None

    @torch.no_grad()
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._loss is None:
            return
        loss, self._loss = self._loss, None
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        grads = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        checks = [loss.float().reshape(1)]
        if scaler is None and grads:
            # The norm of a tensor with a NaN or inf entry is NaN or inf: one number per parameter.
            # torch._foreach_norm is left out of torch's __all__, hence the private-import report.
            norms = torch._foreach_norm([g for _, g in grads])  # pyright: ignore[reportPrivateImportUsage]
            checks.append(torch.stack(norms).float().to(loss.device))
        if bool(torch.isfinite(torch.cat(checks)).all()):  # the one synchronisation
            return
        first = next((name for name, g in grads if not bool(torch.isfinite(g).all())), None)
        what = (
            f"loss is {loss.item()}" if not torch.isfinite(loss) else "loss is finite but gradients are not"
        )
        where = (
            f"first layer with a non-finite gradient: {first}"
            if first
            else "no gradient is non-finite yet (the forward pass overflowed)"
        )
        raise NonFiniteError(
            f"training stopped at global step {trainer.global_step} (epoch {trainer.current_epoch}, batch "
            f"{self._batch_idx}): {what}; {where}. The update was not applied and no "
            "checkpoint was written. Usual causes: a learning rate too high for the batch size (try a lower one "
            "or --trainer.gradient_clip_val 1.0), float16 overflow (try precision bf16-mixed), or bad input "
            "values (NaN/inf in the data)."
        )

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # An optimizer step can still make weights non-finite from finite gradients (a huge learning rate).
        for name, tensor in checkpoint["state_dict"].items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise NonFiniteError(
                    f"refusing to save a checkpoint at global step {trainer.global_step} (epoch "
                    f"{trainer.current_epoch}): weight {name} is NaN or infinite. Training has diverged: lower "
                    "the learning rate or clip gradients (--trainer.gradient_clip_val 1.0)."
                )
