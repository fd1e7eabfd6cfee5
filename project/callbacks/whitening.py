"""`PatchWhiteningInit`: initialise a network's patch-whitening layer from training images."""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info


class PatchWhiteningInit(L.Callback):
    """Calls `net.init_whitening(images)` (e.g. `AirbenchNet`) with normalised training images at fit start.

    Skipped when resuming from a checkpoint, which already holds the whitening weights. Every rank computes
    the same filters from the same images (the first `num_images` of the training split), so DDP stays in sync.

    Args:
        num_images: Training images used to estimate the 2x2 patch covariance.
        train_bias_epochs: Epochs the whitening layer's bias trains before it is frozen too (airbench: 3, the
            bias settles early and later updates only add noise); default: it trains throughout.
    """

    def __init__(self, num_images: int = 5000, train_bias_epochs: int | None = None) -> None:
        self.num_images = num_images
        self.train_bias_epochs = train_bias_epochs

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Dropping the gradient (rather than requires_grad) freezes it under DDP too: the optimizer skips a
        # parameter without one, and DDP's reducer still sees every gradient it expects.
        if self.train_bias_epochs is not None and trainer.current_epoch >= self.train_bias_epochs:
            bias = getattr(getattr(getattr(pl_module, "net", None), "whiten", None), "bias", None)
            if bias is not None:
                bias.grad = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        net = getattr(pl_module, "net", None)
        if net is None or not hasattr(net, "init_whitening") or trainer.ckpt_path is not None:
            return
        # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
        data = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
        n = min(self.num_images, len(data.train_set))
        images, labels, *_ = data.train_set.__getitems__(list(range(n)))
        x, _ = data.transform_batch((images.to(pl_module.device), labels), train=False)
        net.init_whitening(x.float())
        rank_zero_info(f"PatchWhiteningInit: whitening filters set from {n} training images")
        torch.nn.Module.zero_grad(net)
