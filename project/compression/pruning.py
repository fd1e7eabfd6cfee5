"""`ProgressivePruning`: Lightning's ModelPruning with a gradual sparsity schedule (Zhu & Gupta, 2017).

One cut at the end of training costs accuracy; raising the sparsity step by step while training continues
lets the remaining weights take over ("To prune, or not to prune", Zhu & Gupta, arXiv:1710.01878).
"""

from collections.abc import Callable
from typing import Any, Literal, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelPruning
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.nn.utils import prune

from project.compression.epochs import resolve_epoch
from project.errors import UserError


class ProgressivePruning(ModelPruning):
    """Prunes conv and linear weights gradually, from `start_epoch` to `end_epoch`, up to `target_sparsity`.

    At the start of each epoch in the schedule the sparsity is raised to the schedule's value, so every epoch
    trains (recovers) with its new mask and its validation metrics and checkpoints describe the pruned model.
    With the `cubic` schedule most weights go early, while the network is still plastic:
    s(e) = s_f + (s_i - s_f) (1 - p)^3, with p the fraction of the schedule done after epoch e's step.

    When the schedule ends the pruning is made permanent (the masks are folded into the weights) and the zeros
    are kept for the rest of training by re-applying the masks after each optimizer step: so later callbacks,
    quantization-aware training included, see a plain network. Checkpoints always hold plain (masked) weights
    and load into an unpruned network. Logs `sparsity/global` and, per layer, `sparsity/<parameter>` each epoch.

    Epochs may be negative, counting from the end of training (`-3`: the third-to-last epoch).

    Args:
        target_sparsity: Fraction of the pruned weights that are zero at the end of the schedule.
        start_epoch: First epoch whose start prunes.
        end_epoch: Epoch whose start reaches `target_sparsity`; the epochs from it on fine-tune the final mask.
        schedule: `cubic` (Zhu & Gupta) or `linear` growth of the sparsity between the two epochs.
        initial_sparsity: Sparsity the schedule starts from (s_i).
        structured: Prune whole output channels (conv filters, linear rows) by their Ln norm, layer by layer,
            instead of single weights by magnitude across the whole network (global unstructured L1). Channel
            pruning makes the network smaller and faster without sparse kernels, at more accuracy cost. The
            last layer (the logits) is never channel-pruned.
        norm: The n of the Ln norm ranking channels in structured pruning.
        log_per_layer: Also log every layer's sparsity (not only the global one).
    """

    def __init__(
        self,
        target_sparsity: float = 0.5,
        start_epoch: int = 1,
        end_epoch: int = -3,
        schedule: Literal["cubic", "linear"] = "cubic",
        initial_sparsity: float = 0.0,
        structured: bool = False,
        norm: int = 1,
        log_per_layer: bool = True,
    ) -> None:
        if not 0.0 < target_sparsity < 1.0:
            raise UserError(f"ProgressivePruning.target_sparsity must be in (0, 1), got {target_sparsity}")
        if not 0.0 <= initial_sparsity <= target_sparsity:
            raise UserError(
                f"ProgressivePruning.initial_sparsity must be in [0, target_sparsity={target_sparsity}], "
                f"got {initial_sparsity}"
            )
        if schedule not in ("cubic", "linear"):
            raise UserError(f"ProgressivePruning.schedule must be 'cubic' or 'linear', got {schedule!r}")
        super().__init__(
            pruning_fn="ln_structured" if structured else "l1_unstructured",
            parameter_names=["weight"],
            use_global_unstructured=not structured,
            amount=0.0,  # unused: _run_pruning derives each step from the schedule and the current sparsity
            make_pruning_permanent=True,
            use_lottery_ticket_hypothesis=False,
            pruning_dim=0 if structured else None,
            pruning_norm=norm if structured else None,
        )
        self.target_sparsity = target_sparsity
        self.initial_sparsity = initial_sparsity
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.schedule = schedule
        self.structured = structured
        self.log_per_layer = log_per_layer
        self._names: dict[int, str] = {}
        self._masks: list[tuple[Tensor, Tensor]] = []  # (parameter, mask) after the schedule has ended
        self._range: tuple[int, int] | None = None

    # -- what is pruned -------------------------------------------------------------------------------------
    def filter_parameters_to_prune(self, parameters_to_prune: Any = ()) -> list[tuple[nn.Module, str]]:
        layers: list[tuple[nn.Module, str]] = [
            (m, n) for m, n in parameters_to_prune if isinstance(m, nn.modules.conv._ConvNd | nn.Linear)
        ]
        if self.structured and layers:
            layers = layers[:-1]  # removing channels of the logits layer would remove classes
        return layers

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Pruning happens in training only. The test a fit ends with sets the trainer up again, by then on a
        # network other callbacks may have rebuilt (quantization-aware training's): the layers found for the
        # fit are not in it, and there is nothing to prune.
        if stage != "fit":
            return
        super().setup(trainer, pl_module, stage)
        # ModelPruning lists parameters name by name: keep module order (the first layer first).
        order = {id(m): i for i, m in enumerate(pl_module.modules())}
        self._parameters_to_prune = sorted(self._parameters_to_prune, key=lambda p: order[id(p[0])])
        if not self._parameters_to_prune:
            raise UserError(
                f"ProgressivePruning: {type(pl_module).__name__} has no conv or linear layer to prune"
            )
        names = {id(m): name for name, m in pl_module.named_modules()}
        self._names = {id(m): f"{names[id(m)]}.{p}" for m, p in self._parameters_to_prune}

    # -- the schedule ---------------------------------------------------------------------------------------
    def resolved_end_epoch(self, trainer: L.Trainer) -> int:
        """The epoch whose start reaches the target sparsity (and makes the pruning permanent)."""
        return self._epochs(trainer, notify=False)[1]

    def _epochs(self, trainer: L.Trainer, notify: bool = True) -> tuple[int, int]:
        max_epochs = trainer.max_epochs
        start = resolve_epoch(self.start_epoch, max_epochs, "ProgressivePruning.start_epoch", notify)
        end = resolve_epoch(self.end_epoch, max_epochs, "ProgressivePruning.end_epoch", notify)
        if end < start:
            if self.start_epoch >= 0 and self.end_epoch >= 0:
                raise UserError(
                    f"ProgressivePruning: end_epoch ({self.end_epoch}) comes before start_epoch ({self.start_epoch})"
                )
            if notify:
                rank_zero_info(
                    f"ProgressivePruning: the run (trainer.max_epochs={trainer.max_epochs}) is too short for "
                    f"start_epoch={self.start_epoch}, end_epoch={self.end_epoch}: pruning at epoch {end} in one step"
                )
            start = end
        return start, end

    @property
    def _schedule(self) -> tuple[int, int]:
        """The (start, end) epochs, resolved in `on_fit_start` against the run's length."""
        if self._range is None:
            raise RuntimeError("ProgressivePruning: the schedule is resolved in on_fit_start, not before")
        return self._range

    def sparsity_at(self, epoch: int) -> float | None:
        """The schedule's sparsity for `epoch` (reached at its start), or None before the schedule starts."""
        start, end = self._schedule
        if epoch < start:
            return None
        progress = min(1.0, (epoch - start + 1) / (end - start + 1))
        s_i, s_f = self.initial_sparsity, self.target_sparsity
        if self.schedule == "linear":
            return s_i + (s_f - s_i) * progress
        return s_f + (s_i - s_f) * (1.0 - progress) ** 3

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._range = self._epochs(trainer)
        if not self.structured:
            # torch.nn.utils.prune's global pruning flattens the weights with .view(-1), which channels-last
            # (NHWC) weights do not allow: the layers it prunes go back to the default layout.
            for module, name in self._parameters_to_prune:
                param = getattr(module, f"{name}_orig", None)
                param = getattr(module, name) if param is None else param
                param.data = param.data.contiguous()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Resuming: checkpoints hold plain weights, so the masks are rebuilt from the zeros.
        epoch = trainer.current_epoch
        start, end = self._schedule
        if epoch > end:
            self._keep_zeros()
        elif epoch > start:
            for module, name in self._parameters_to_prune:
                if not prune.is_pruned(module):
                    prune.custom_from_mask(module, name, getattr(module, name) != 0)

    def _run_pruning(self, current_epoch: int) -> None:
        target = self.sparsity_at(current_epoch)
        if target is None or self._masks:
            return
        if self.structured:  # layer by layer, each to the target (relative to its remaining channels)
            # Not global: ModelPruning made pruning_fn prune.ln_structured with its dim and norm bound, a
            # function (typed together with the global case's BasePruningMethod class).
            pruning_fn = cast(Callable[..., Any], self.pruning_fn)
            for module, name in self._parameters_to_prune:
                amount = _step(target, _sparsity([(module, name)]))
                if amount > 0:
                    pruning_fn(module, name=name, amount=amount)
        else:
            amount = _step(target, _sparsity(self._parameters_to_prune))
            if amount > 0:
                self._apply_global_pruning(amount)
        if current_epoch >= self._schedule[1]:
            self._keep_zeros()
            rank_zero_info(
                f"ProgressivePruning: epoch {current_epoch}: target sparsity {self.target_sparsity:.0%} reached "
                f"({_sparsity(self._parameters_to_prune):.2%}); pruning made permanent"
            )

    def _keep_zeros(self) -> None:
        """Folds the masks into the weights and from now on re-zeroes the pruned weights after each step."""
        for module, _ in self._parameters_to_prune:
            self.make_pruning_permanent(module)
        self._masks = [
            (weight, (weight != 0).to(weight.dtype))
            for weight in (getattr(m, n) for m, n in self._parameters_to_prune)
        ]

    # -- hooks ----------------------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._run_pruning(trainer.current_epoch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # ModelPruning prunes here; this schedule prunes at epoch start. Log what this epoch trained with.
        if self.sparsity_at(trainer.current_epoch) is None:
            return
        pl_module.log("sparsity/global", _sparsity(self._parameters_to_prune), sync_dist=False)
        if self.log_per_layer:
            for module, name in self._parameters_to_prune:
                pl_module.log(f"sparsity/{self._names[id(module)]}", _sparsity([(module, name)]))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pass  # ModelPruning may prune here; this schedule prunes at epoch start

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._masks:
            params, masks = zip(*self._masks, strict=True)
            # torch._foreach_mul_ is left out of torch's __all__, hence the private-import report.
            torch._foreach_mul_(list(params), list(masks))  # pyright: ignore[reportPrivateImportUsage]

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Fold masks into the saved weights in place (ModelPruning rebuilds the whole state_dict from the
        # module, which would undo other callbacks' edits of it).
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.endswith("_mask")]:
            base = key.removesuffix("_mask")
            if base + "_orig" in state:
                mask = state.pop(key)
                orig = state.pop(base + "_orig")
                state[base] = (orig * mask.to(orig.dtype)).cpu()


def _effective(module: nn.Module, name: str) -> Tensor:
    """The weight the module computes with (its `weight` attribute is refreshed only at the next forward)."""
    if hasattr(module, f"{name}_mask"):
        return getattr(module, f"{name}_orig") * getattr(module, f"{name}_mask")
    return getattr(module, name)


@torch.no_grad()
def _sparsity(parameters: list[tuple[nn.Module, str]]) -> float:
    """Fraction of zeros over all the given weights."""
    zeros = sum(int((_effective(m, n) == 0).sum()) for m, n in parameters)
    total = sum(_effective(m, n).numel() for m, n in parameters)
    return zeros / max(total, 1)


def _step(target: float, current: float) -> float:
    """The amount to prune now, as torch's pruning counts it: a fraction of the weights not yet pruned."""
    if current >= target or current >= 1.0:
        return 0.0
    return min(1.0, (target - current) / (1.0 - current))
