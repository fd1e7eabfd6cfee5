"""The W&B charts `WandbDashboard` logs for values, and validation images made viewable again."""

from typing import Any

import torch
from torch import Tensor


def to_uint8(images: Tensor, datamodule: Any) -> Tensor:
    """Normalised (N, C, H, W) images back to uint8 on the CPU, with the DataModule's mean and std."""
    images = images.detach().float().cpu()
    mean, std = getattr(datamodule, "mean", None), getattr(datamodule, "std", None)
    if mean is not None and std is not None and len(mean) == images.shape[1]:
        shape = (1, -1, 1, 1)
        images = images * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)
    else:  # unknown normalisation: stretch each image to [0, 1]
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        high = images.amax(dim=(1, 2, 3), keepdim=True)
        images = (images - low) / (high - low).clamp_min(1e-8)
    images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    return images if images.shape[1] != 1 else images.expand(-1, 3, -1, -1)


def value_charts(predicted: Tensor, true: Tensor, names: list[str], epoch: int) -> dict[str, Any]:
    """W&B scatter plots of a regression's validation: predicted against true values, one chart per value (for
    one value `val/predicted_vs_true`, else `val/predicted_vs_true/<name>`)."""
    import wandb

    charts: dict[str, Any] = {}
    for i, name in enumerate(names):
        points = [[float(t), float(p)] for t, p in zip(true[:, i], predicted[:, i], strict=True)]
        table = wandb.Table(columns=["true", "predicted"], data=points)
        key = "val/predicted_vs_true" if len(names) == 1 else f"val/predicted_vs_true/{name}"
        title = f"Validation {name}: predicted vs true, epoch {epoch}"
        charts[key] = wandb.plot.scatter(table, "true", "predicted", title=title)
    return charts
