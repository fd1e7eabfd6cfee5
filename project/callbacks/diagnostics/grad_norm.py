"""`GradientNormMonitor`: gradient norms, total and per parameter, logged before each optimizer step."""

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import grad_norm
from torch.optim import Optimizer


def logs_this_step(trainer: L.Trainer, stepped: bool = False) -> bool:
    """Whether the values logged in this training step reach the loggers (every `log_every_n_steps` steps, and
    at the last one): measured only then, a diagnostic costs nothing in between. `stepped`: asked after the
    optimizer step (in `on_train_batch_end`), when `global_step` already counts it."""
    # Lightning's logger connector sets `log_every_n_steps`, outside the class: pyright cannot see it.
    n = trainer.log_every_n_steps  # pyright: ignore[reportAttributeAccessIssue]
    step = trainer.global_step + (0 if stepped else 1)
    return bool(trainer.loggers) and n > 0 and (step % n == 0 or trainer.should_stop)


class GradientNormMonitor(Callback):
    """Logs `grad_norm/total` and `grad_norm/<parameter>` with Lightning's `grad_norm`.

    Measured in `on_before_optimizer_step`: after gradient accumulation and after the mixed-precision scaler
    has unscaled the gradients, before clipping, so it shows what clipping acts on. Computed only on the steps
    the trainer logs (`trainer.log_every_n_steps`), so it costs nothing in between.

    Args:
        norm_type: The p of the p-norm (2.0: Euclidean; `inf`: largest absolute entry).
        per_layer: Also log each parameter's norm (else only the total).
    """

    def __init__(self, norm_type: float = 2.0, per_layer: bool = True) -> None:
        super().__init__()
        if float(norm_type) <= 0:
            raise ValueError(f"GradientNormMonitor.norm_type must be positive (or inf), got {norm_type}")
        self.norm_type = float(norm_type)
        self.per_layer = per_layer

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer
    ) -> None:
        if not logs_this_step(trainer):
            return
        norms = grad_norm(pl_module, self.norm_type)
        prefix = f"grad_{self.norm_type}_norm"
        metrics = {"grad_norm/total": norms.pop(f"{prefix}_total")} if norms else {}
        if self.per_layer:
            # A pruned weight's parameter is `weight_orig` while its pruning mask is attached: one name throughout.
            metrics.update(
                {k.replace(prefix, "grad_norm", 1).removesuffix("_orig"): v for k, v in norms.items()}
            )
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False)
