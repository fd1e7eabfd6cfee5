"""`UpdateRatioMonitor`: how much each optimizer step changes each layer, relative to its weights."""

import math
import statistics
from collections import defaultdict
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer

from project.callbacks.diagnostics.grad_norm import logs_this_step


class UpdateRatioMonitor(Callback):
    """Logs `update_ratio/<parameter>` = |update| / |weight| per layer and warns about layers far outside the
    healthy band.

    A ratio around 1e-3 per step is the classic rule of thumb (healthy roughly 1e-5 to 1e-3): far below, the
    layer barely learns (learning rate too low, vanishing gradients, a frozen layer); far above, it is
    rewritten every step (learning rate too high, exploding gradients). Only weight matrices and kernels are
    watched (biases and norm scales are not layers' weights).

    Args:
        measure: `update`: the change the optimizer actually made (momentum, Adam's scaling and weight decay
            included; measured by copying the weights before the step, on logged steps only). `lr_grad`:
            learning rate x |gradient| / |weight|, the textbook estimate (exact for plain SGD).
        healthy: The healthy (low, high) band.
        warn_factor: Warn about layers whose median ratio over the epoch is this many times outside the band.
    """

    def __init__(
        self,
        measure: Literal["update", "lr_grad"] = "update",
        healthy: tuple[float, float] = (1e-5, 1e-3),
        warn_factor: float = 10.0,
    ) -> None:
        super().__init__()
        if measure not in ("update", "lr_grad"):
            raise ValueError(f"UpdateRatioMonitor.measure must be 'update' or 'lr_grad', got {measure!r}")
        if not 0 < healthy[0] < healthy[1]:
            raise ValueError(
                f"UpdateRatioMonitor.healthy must be (low, high) with 0 < low < high, got {healthy}"
            )
        self.measure = measure
        self.healthy = tuple(healthy)
        self.warn_factor = warn_factor
        self._before: dict[str, Tensor] = {}
        self._ratios: dict[str, list[float]] = defaultdict(list)
        self._warned = False

    def _watched(self, pl_module: L.LightningModule) -> dict[str, Tensor]:
        return {
            n: p
            for n, p in pl_module.named_parameters()
            if p.requires_grad and p.ndim > 1 and p.grad is not None
        }

    @torch.no_grad()
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer
    ) -> None:
        if not logs_this_step(trainer):
            return
        params = self._watched(pl_module)
        if self.measure == "update":
            self._before = {name: p.detach().clone() for name, p in params.items()}
            return
        lrs = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        self._record(
            pl_module,
            {
                name: lrs.get(id(p), 0.0) * grad.norm() / p.norm()
                for name, p in params.items()
                if id(p) in lrs and (grad := p.grad) is not None
            },
        )

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self._before:
            return
        params = dict(pl_module.named_parameters())
        ratios = {
            name: (params[name].detach() - before).norm() / before.norm()
            for name, before in self._before.items()
            if name in params
        }
        self._before = {}
        self._record(pl_module, ratios)

    def _record(self, pl_module: L.LightningModule, ratios: dict[str, Tensor]) -> None:
        values = {name: float(r) for name, r in ratios.items()}
        values = {
            name: v for name, v in values.items() if v == v and v != float("inf")
        }  # skip 0/0 (all-zero)
        for name, value in values.items():
            self._ratios[name].append(value)
        if values:
            pl_module.log_dict(
                {f"update_ratio/{n}": v for n, v in values.items()}, on_step=True, on_epoch=False
            )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        low, high = self.healthy
        outside = []
        for name, values in self._ratios.items():
            median = statistics.median(values)
            if median < low / self.warn_factor or median > high * self.warn_factor:
                outside.append((name, median))
        self._ratios.clear()
        if outside and not self._warned:
            self._warned = True  # once per run; the ratios stay in the logs
            center = math.log10(low * high) / 2  # the farthest outside first (in orders of magnitude)
            outside.sort(key=lambda item: abs(math.log10(max(item[1], 1e-30)) - center), reverse=True)
            listed = ", ".join(f"{name} ({ratio:.1e})" for name, ratio in outside[:8])
            rank_zero_warn(
                f"epoch {trainer.current_epoch}: {len(outside)} layer(s) with an update/weight ratio far outside "
                f"the healthy {low:.0e}..{high:.0e} band (median per step): {listed}. Far below: the layer barely "
                "learns (learning rate too low, vanishing gradients); far above: it is rewritten every step "
                "(learning rate too high, exploding gradients)."
            )
