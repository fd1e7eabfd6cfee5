"""Batched image augmentation that runs on the batch's device (the GPU when there is one).

Per-sample torchvision transforms run in DataLoader workers on the CPU and are the bottleneck of small-image
training. These functions draw independent random parameters per image, so one call on a whole uint8
batch has the same distribution as the per-sample RandomCrop(padding) + RandomHorizontalFlip pipeline.
"""

import torch
from torch import Tensor


def random_crop(x: Tensor, padding: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero-pad by `padding` on each side, then take an independent random crop of the input size per image."""
    if padding <= 0:
        return x
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (n, 1, h, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (n, 1, 1, w)
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channels, rows, cols]


def random_flip(x: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Flip each image left-right with probability `p`."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def cutout(x: Tensor, size: int, generator: torch.Generator | None = None) -> Tensor:
    """Zero one `size` x `size` square per image, centred anywhere in the image (DeVries & Taylor, 2017)."""
    if size <= 0:
        return x
    n, _, h, w = x.shape
    cy = torch.randint(0, h, (n, 1, 1), device=x.device, generator=generator)
    cx = torch.randint(0, w, (n, 1, 1), device=x.device, generator=generator)
    ys = torch.arange(h, device=x.device)[None, :, None]
    xs = torch.arange(w, device=x.device)[None, None, :]
    inside = ((ys - cy).abs() <= size // 2) & ((xs - cx).abs() <= size // 2)
    return x.masked_fill(inside[:, None], 0)


def normalize(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """uint8 (or float in [0, 255]) images to float, standardised per channel."""
    return (x.float() / 255.0 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
