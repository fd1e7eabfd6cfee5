"""Test callbacks that record what training did, for the scale-out tests (usable in subprocess runs).

Name them in a run with `--trainer.callbacks+=tests.probes.GradientProbe --trainer.callbacks.path out.json`.
Under FSDP2 the gradients are sharded DTensors: the probes gather them (every rank takes part, rank 0 writes).
"""

import json
import math
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed.tensor import DTensor


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [_full(p.grad).float() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


def _norm(grads: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads))


class GradientProbe(Callback):
    """Records, per optimizer step, the gradients' total L2 norm and largest |element| twice: before Lightning
    clips them (`on_before_optimizer_step`) and as the optimizer's update uses them (after clipping).

    Args:
        path: Where rank 0 writes `{"before": [{"norm", "max"}...], "seen": [...]}` at the end of fitting.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.before: list[dict[str, float]] = []
        self.seen: list[dict[str, float]] = []
        self._hooked: set[int] = set()

    @staticmethod
    def _stats(optimizer: torch.optim.Optimizer) -> dict[str, float]:
        grads = _grads(optimizer)
        return {"norm": _norm(grads), "max": max(float(g.abs().max()) for g in grads)}

    def _pre_step(
        self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict
    ) -> tuple[tuple, dict] | None:
        # Lightning steps with a closure that runs backward and then clips: the optimizer's update uses the
        # gradients as they are when the closure returns. Without a closure (the fp16 GradScaler path),
        # backward and clipping already happened.
        # `args` starts with the optimizer itself; Lightning passes the closure by keyword.
        closure = kwargs.get("closure")
        if closure is None:
            self.seen.append(self._stats(optimizer))
            return None

        def recorded() -> object:
            loss = closure()
            self.seen.append(self._stats(optimizer))
            return loss

        return args, {**kwargs, "closure": recorded}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            if id(optimizer) not in self._hooked:
                optimizer.register_step_pre_hook(self._pre_step)
                self._hooked.add(id(optimizer))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.before.append(self._stats(optimizer))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.path and trainer.is_global_zero:
            Path(self.path).write_text(json.dumps({"before": self.before, "seen": self.seen}))


class PredictionProbe(Callback):
    """At the end of fitting, runs the model on a fixed random batch and saves the logits (rank 0).

    Args:
        path: Where the logits go (`torch.save` of a float32 tensor).
        seed: Seed of the batch (the test builds the same batch to compare against).
    """

    def __init__(self, path: str, seed: int = 0) -> None:
        self.path, self.seed = path, seed

    @staticmethod
    def batch(seed: int = 0, shape: tuple[int, ...] = (8, 3, 32, 32)) -> torch.Tensor:
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.eval()
        # Every rank runs the forward: FSDP2 gathers each block's weights from all ranks.
        with torch.no_grad():
            logits = pl_module(self.batch(self.seed).to(pl_module.device)).float().cpu()
        if trainer.is_global_zero:
            torch.save(logits, self.path)


class ForwardDtype(Callback):
    """Records the dtype of the network's output in each training step (what autocast computed in)."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.net.register_forward_hook(
            lambda module, args, out: self.dtypes.add(out.dtype) if module.training else None
        )


class ScalerAtStart(Callback):
    """Records the GradScaler's scale when training starts, i.e. after a checkpoint was restored."""

    def __init__(self) -> None:
        self.scale: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.scale = trainer.precision_plugin.scaler.get_scale()
