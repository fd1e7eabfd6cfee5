"""`GradientNormMonitor`: gradient norms, total and per parameter, logged before each optimizer step."""

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import grad_norm
from torch.optim import Optimizer


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
        # The same test the trainer uses to decide whether this step's logged values reach the loggers.
        if not trainer.loggers or not trainer._logger_connector.should_update_logs:
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
