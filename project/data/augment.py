"""Batched image augmentation that runs on the batch's device (the GPU when there is one).

Per-sample torchvision transforms run in DataLoader workers on the CPU and are the bottleneck of small-image
training. These functions draw independent random parameters per image, so one call on a whole uint8
batch has the same distribution as the per-sample RandomCrop(padding) + RandomHorizontalFlip pipeline.
"""

from typing import Literal

import torch
from torch import Tensor


def random_crop(
    x: Tensor,
    padding: int,
    generator: torch.Generator | None = None,
    padding_mode: Literal["constant", "reflect"] = "constant",
) -> Tensor:
    """Pad by `padding` on each side (zeros, or the image mirrored at its border with `reflect`), then take an
    independent random crop of the input size per image."""
    if padding <= 0:
        return x
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding), mode=padding_mode)
    # Every possible crop as a view: (n, c, 2p+1, 2p+1, h, w); then pick one offset per image (one gather).
    windows = padded.unfold(2, h, 1).unfold(3, w, 1)
    dy = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=x.device, generator=generator)
    return windows[torch.arange(n, device=x.device), :, dy, dx]


def random_flip(x: Tensor, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Flip each image left-right with probability `p`."""
    flip = torch.rand(x.shape[0], device=x.device, generator=generator) < p
    out = x.clone()
    out[flip] = x[flip].flip(-1)  # touches only the flipped half
    return out


def alternating_flip(x: Tensor, rows: Tensor, epoch: int, seed: int = 0) -> Tensor:
    """Flip each image in every other epoch, starting from a side drawn once per image (airbench's alternating
    flip): over any two epochs every image is seen both ways, where a fresh coin per epoch shows a quarter of
    them only one way. `rows` identifies each image of the batch within its dataset."""
    # Knuth's multiplicative hash of the row: a fixed, evenly split starting side per image, without state.
    start = ((rows.long() * 2654435761 + seed) >> 16) & 1
    flip = (start ^ (epoch & 1)).bool()
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


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
    """uint8 (or float in [0, 255]) images to float, standardised per channel: (x / 255 - mean) / std."""
    scale = (1.0 / (255.0 * std)).view(1, -1, 1, 1)
    shift = (mean / std).view(1, -1, 1, 1)
    return torch.addcmul(-shift, x.float(), scale)  # one fused pass instead of three
