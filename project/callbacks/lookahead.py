"""`Lookahead`: airbench's scheduled lookahead, the live weights pulled back towards their running average."""

from typing import Any

import lightning as L
import torch


class Lookahead(L.Callback):
    """Every `every_n_steps` optimizer steps, the running average moves towards the weights, and the weights are
    set to it: `avg = decay * avg + (1 - decay) * w; w = avg` (buffers such as BatchNorm statistics too).

    The decay grows over training as `decay * (step / total_steps) ** power`: nothing is held back early, when
    the weights must travel, and late steps are averaged heavily, when SGD only jitters around a minimum. At
    the last step the weights become the average. Unlike an EMA kept aside for evaluation (Lightning's
    `EMAWeightAveraging`), the training trajectory itself is averaged: this is what airbench94 does
    (0.95^5 every 5 steps, cubic), worth about 0.1-0.2 points there.

    Args:
        every_n_steps: Optimizer steps between two updates.
        decay: The largest decay, reached at the last step.
        power: How fast the decay grows with the fraction of training done.
    """

    def __init__(self, every_n_steps: int = 5, decay: float = 0.95**5, power: float = 3.0) -> None:
        if every_n_steps < 1 or not 0.0 <= decay < 1.0:
            raise ValueError(
                f"Lookahead: need every_n_steps >= 1 and 0 <= decay < 1, got {every_n_steps}, {decay}"
            )
        self.every_n_steps, self.decay, self.power = every_n_steps, decay, power
        self.average: dict[str, torch.Tensor] = {}
        self._last_step = 0
        self._total = 1

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        floats = self._floats(pl_module)
        if self.average:  # restored from the checkpoint being resumed (loaded onto the CPU)
            self.average = {k: v.to(floats[k].device) for k, v in self.average.items()}
        else:
            self.average = {k: v.detach().clone() for k, v in floats.items()}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._total = max(1, int(trainer.estimated_stepping_batches))  # known once the loaders are set up

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step, total = trainer.global_step, self._total
        last = step >= total or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if step == self._last_step or not (last or step % self.every_n_steps == 0):
            return  # no optimizer step since the last call (accumulation), or not an update step
        self._last_step = step
        decay = 1.0 if last else self.decay * (step / total) ** self.power
        for name, value in self._floats(pl_module).items():
            average = self.average[name]
            average.lerp_(value, 1.0 - decay)
            value.copy_(average)

    @staticmethod
    def _floats(pl_module: L.LightningModule) -> dict[str, torch.Tensor]:
        return {k: v for k, v in pl_module.state_dict(keep_vars=True).items() if v.is_floating_point()}

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average, "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.average = state_dict["average"]
        self._last_step = state_dict["last_step"]
