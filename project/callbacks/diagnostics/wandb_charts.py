"""Validation images made viewable again, for the W&B dashboard's tables."""

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
