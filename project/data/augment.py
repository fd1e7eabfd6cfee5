"""Batched augmentation on the batch's device, and the settings a DataModule holds (`BatchAugmentation`).

Per-sample transforms in CPU loader workers are the bottleneck of small-image training; these draw independent
parameters per image, so one call on a uint8 batch has the distribution of the per-sample pipeline.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from project.data.targets import TargetKind
from project.errors import UserError


def random_crop(
    x: Tensor,
    padding: int,
    generator: torch.Generator | None = None,
    padding_mode: Literal["constant", "reflect"] = "constant",
) -> Tensor:
    """Pad by `padding` (zeros, or the image mirrored with `reflect`), then a random crop of the input size per
    image."""
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
    """Flip each image (`rows`: its dataset row) every other epoch from a side drawn once (airbench): over two
    epochs every image is seen both ways, where a fresh coin shows a quarter of them one way only."""
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


def sample_boxes(
    n: int,
    h: int,
    w: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    device: torch.device | str = "cpu",
    tries: int = 10,
) -> tuple[Tensor, Tensor]:
    """One (x0, y0, x1, y1) box per image with RandomResizedCrop's distribution (area uniform in `scale`, log
    aspect ratio in `ratio`, the first of `tries` draws that fits), and whether each found one (else: whole)."""
    area = torch.empty(n, tries, device=device).uniform_(*scale) * (h * w)
    log_r = torch.empty(n, tries, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1]))
    bw, bh = (area * log_r.exp()).sqrt(), (area / log_r.exp()).sqrt()
    fits = (bw <= w) & (bh <= h)
    first = fits.float().argmax(1, keepdim=True)  # the first try that fits (0 when none does)
    bw, bh = bw.gather(1, first)[:, 0], bh.gather(1, first)[:, 0]
    found = fits.any(1)
    bw, bh = torch.where(found, bw, float(w)), torch.where(found, bh, float(h))
    x0 = torch.rand(n, device=device) * (w - bw)
    y0 = torch.rand(n, device=device) * (h - bh)
    return torch.stack([x0, y0, x0 + bw, y0 + bh], 1), found


def random_resized_crop(
    x: Tensor, size: tuple[int, int], scale: tuple[float, float], ratio: tuple[float, float]
) -> Tensor:
    """A RandomResizedCrop per image in one `roi_align` call (each output pixel averages the pixels under it: no
    aliasing); float output in the input's units."""
    from torchvision.ops import roi_align

    n, _, h, w = x.shape
    boxes, _ = sample_boxes(n, h, w, scale, ratio, x.device)
    index = torch.arange(n, device=x.device, dtype=boxes.dtype)[:, None]
    return roi_align(x.float(), torch.cat([index, boxes], 1), size, aligned=True)


def resize(x: Tensor, size: tuple[int, int]) -> Tensor:
    """The whole batch resized to `size` (antialiased bilinear); unchanged when it has that size already."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return torch.nn.functional.interpolate(x.float(), size, mode="bilinear", antialias=True)


def center_crop(x: Tensor, share: float) -> Tensor:
    """The central `share` of each side of every image in the batch (a view, no copy)."""
    h, w = x.shape[-2:]
    ch, cw = max(1, round(h * share)), max(1, round(w * share))
    top, left = (h - ch) // 2, (w - cw) // 2
    return x[..., top : top + ch, left : left + cw]


def evaluation_view(x: Tensor, share: float, size: tuple[int, int]) -> Tensor:
    """What evaluation (and an exported model's consumer) makes of decoded squares: the central `share` of each
    side, resized to the network's input `size`."""
    return resize(center_crop(x, share) if share < 1 else x, size)


def random_erasing(x: Tensor, p: float) -> Tensor:
    """torchvision's RandomErasing (area 2-33 %, ratio 0.3-3.3, filled with 0: the normalised mean) with
    probability `p` per image, as one mask over the batch."""
    if p <= 0:
        return x
    n, _, h, w = x.shape
    boxes, found = sample_boxes(n, h, w, (0.02, 0.33), (0.3, 3.3), x.device)
    erase = found & (torch.rand(n, device=x.device) < p)
    x0, y0, x1, y1 = boxes.round().long().unbind(1)
    ys = torch.arange(h, device=x.device)[None, :, None]
    xs = torch.arange(w, device=x.device)[None, None, :]
    inside = (ys >= y0[:, None, None]) & (ys < y1[:, None, None])
    inside = inside & (xs >= x0[:, None, None]) & (xs < x1[:, None, None]) & erase[:, None, None]
    return x.masked_fill(inside[:, None], 0)


def mix_batch(
    x: Tensor, targets: Tensor, kind: TargetKind, mixup_alpha: float, cutmix_alpha: float, p: float = 1.0
) -> tuple[Tensor, Tensor]:
    """MixUp (Zhang et al., 2018) or CutMix (Yun et al., 2019) of a batch with itself reversed, as timm does: one
    Beta(alpha, alpha) weight per batch, one of the two at even odds when both are set, neither with probability
    `1 - p`. The `kind` says what is mixed (`mixable`). The draws come from the global CPU generator, which
    checkpoints restore: a resumed run mixes as the run never stopped."""
    soft = kind.mixable(targets)
    apply, use_cutmix = torch.rand(2).tolist()
    if apply >= p or (mixup_alpha <= 0 and cutmix_alpha <= 0):
        return x, soft
    cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or use_cutmix < 0.5)
    alpha = torch.tensor(cutmix_alpha if cutmix else mixup_alpha)
    lam = float(torch.distributions.Beta(alpha, alpha).sample())
    other = x.flip(0)
    if cutmix:  # a box of area (1 - lam) from the partner, clipped at the border; lam is then its true share
        h, w = x.shape[-2:]
        cy, cx = (torch.rand(2) * torch.tensor([h, w])).long().tolist()
        ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        y0, y1, x0, x1 = (
            max(cy - ch // 2, 0),
            min(cy + ch // 2, h),
            max(cx - cw // 2, 0),
            min(cx + cw // 2, w),
        )
        x = x.clone()
        x[..., y0:y1, x0:x1] = other[..., y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        x = torch.lerp(other, x, lam)  # lam * x + (1 - lam) * other
    return x, torch.lerp(soft.flip(0), soft, lam)


@dataclass(frozen=True)
class BatchAugmentation:
    """The training augmentation on the batch's device, and how evaluation views an image (`data.augment`).

    Training gets the padded random crop and the flip (on by default) and the regularisers of long recipes (off
    by default), each image its own draws; evaluation sees each image whole (or its central `eval_crop`).

    Args:
        crop_padding: Padding for the random crop; 0 disables the crop. Default: an eighth of the input's side
            (4 for 32x32 CIFAR).
        crop_padding_mode: What the padding holds: `constant` (zeros) or `reflect` (the image mirrored at its
            border, as airbench does: no black bars for the network to learn about).
        flip: Horizontal flips: `true`, a coin per image and epoch; `alternate`, every other epoch from a random
            start (needs the images in memory: CIFAR, cached folders); `false`, none.
        cutout: Side of the square zeroed per training image (Cutout); 0 disables it.
        mixup_alpha: MixUp's Beta(alpha, alpha) (0.2 is common); 0: off. Mixed batches carry soft targets for
            the loss and each image's own labels for the training metrics.
        cutmix_alpha: CutMix's Beta(alpha, alpha) (1.0 is common); 0: off.
        mix_prob: Probability that a training batch is mixed at all (when an alpha is set).
        random_erasing: Probability that a training image gets one random box zeroed (RandomErasing); 0: off.
        crop_scale: A random-resized crop per training image instead of the padded crop, its area share drawn
            from this range (torchvision's default [0.08, 1.0]); best with a larger cached source. None: off.
        crop_ratio: The range of the crop box's aspect ratio (width / height), drawn log-uniformly.
        eval_crop: The central share of each side evaluation keeps before resizing (1.0: all). Random-resized
            crops enlarge objects; torchvision crops 0.875 at test so they appear as large as learned.
        trivial_augment: TrivialAugmentWide (Müller & Hutter, 2021) per training image, in the loader workers.
    """

    crop_padding: int | None = None
    crop_padding_mode: Literal["constant", "reflect"] = "constant"
    flip: bool | Literal["alternate"] = True
    cutout: int = 0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_prob: float = 1.0
    random_erasing: float = 0.0
    crop_scale: tuple[float, float] | None = None
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    eval_crop: float = 1.0
    trivial_augment: bool = False

    def __post_init__(self) -> None:
        if (self.crop_padding or 0) < 0 or self.cutout < 0:
            raise UserError(
                f"data.augment.crop_padding and data.augment.cutout must be >= 0, got {self.crop_padding} and "
                f"{self.cutout}"
            )
        alphas = {"mixup_alpha": self.mixup_alpha, "cutmix_alpha": self.cutmix_alpha}
        probs = {"mix_prob": self.mix_prob, "random_erasing": self.random_erasing}
        bad: dict[str, object] = {k: v for k, v in alphas.items() if v < 0}
        bad |= {k: v for k, v in probs.items() if not 0 <= v <= 1}
        if not 0 < self.eval_crop <= 1:
            bad["eval_crop"] = self.eval_crop
        if self.crop_scale is not None and not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            bad["crop_scale"] = list(self.crop_scale)
        if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            bad["crop_ratio"] = list(self.crop_ratio)
        if bad:
            key, value = next(iter(bad.items()))
            raise UserError(
                f"data.augment.{key}={value} is out of range: alphas are >= 0, probabilities in [0, 1], "
                "crop_scale a range [low, high] within (0, 1], crop_ratio a range [low, high] above 0, eval_crop "
                "in (0, 1]"
            )
        # Ranges as tuples of floats, whichever sequence they were given as (a config's list).
        if self.crop_scale is not None:
            object.__setattr__(self, "crop_scale", (float(self.crop_scale[0]), float(self.crop_scale[1])))
        object.__setattr__(self, "crop_ratio", (float(self.crop_ratio[0]), float(self.crop_ratio[1])))

    @property
    def mixes(self) -> bool:
        """Whether training batches are mixed (and so carry soft targets besides each image's own)."""
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def padding(self, size: tuple[int, int]) -> int:
        """The random crop's padding for an input of `size`: `crop_padding`, else an eighth of its side."""
        return size[0] // 8 if self.crop_padding is None else self.crop_padding

    def sample_transform(self) -> Callable[[Tensor], Tensor] | None:
        """The per-image transform of training images in the loader workers (TrivialAugmentWide), or None."""
        if not self.trivial_augment:
            return None
        from torchvision.transforms import v2

        return v2.TrivialAugmentWide()

    def images(
        self, x: Tensor, rows: Tensor | None, train: bool, epoch: int, size: tuple[int, int], seed: int
    ) -> Tensor:
        """A batch at the network's input `size`, cropped and flipped if `train` (before normalising); `rows`:
        the images' dataset rows (alternating flips)."""
        if not train:
            return evaluation_view(x, self.eval_crop, size)
        if self.crop_scale is not None:
            x = random_resized_crop(x, size, self.crop_scale, self.crop_ratio)
        else:
            x = random_crop(resize(x, size), self.padding(size), padding_mode=self.crop_padding_mode)
        if self.flip == "alternate" and rows is not None:
            return alternating_flip(x, rows, epoch, seed)
        return random_flip(x) if self.flip else x

    def normalized(
        self, x: Tensor, y: Tensor, train: bool, kind: TargetKind
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
        """Cutout, random erasing and MixUp/CutMix of a normalised training batch of targets of `kind`:
        `(images, targets)`, or for a mixed one `(images, mixed targets, targets)`."""
        if not train:
            return x, y
        x = random_erasing(cutout(x, self.cutout), self.random_erasing)
        if not self.mixes:
            return x, y
        x, soft = mix_batch(x, y, kind, self.mixup_alpha, self.cutmix_alpha, self.mix_prob)
        return x, soft, y  # the loss takes the soft targets; the training metrics each image's own labels
