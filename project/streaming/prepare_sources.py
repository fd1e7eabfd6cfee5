"""What `python -m project prepare` reads from a source, and how one sample is encoded.

A source is the DataModule its config builds; it gives its splits as items and labels (`labelled_splits`): an
item is an image file's path (class folders, CSV, multi-label CSV) or an image already in memory as an
(H, W, 3) uint8 array (CIFAR). `encode_sample` turns
an item into the stored sample in litdata's worker processes; `mean_std` gives the training images'
statistics for the metadata; `fold_order` deals the training split into stratified folds.
"""

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from project.data.datamodule import LabelledSplits
from project.data.image_reading import _high_depth_to_8bit, decode_image, open_image
from project.data.splits import check_parts, stratified_parts
from project.errors import UserError, warn

#: Training images the mean and std are computed over (an even spread of the split), at most.
STATS_SAMPLES = 2000


def read_source(data: Any) -> LabelledSplits:
    """The samples of a DataModule built from the source's config, split by split (any DataModule whose
    `labelled_splits` lists them: class folders, CSVs, CIFAR, a user's own)."""
    if (split := getattr(data, "split", None)) is not None:
        raise UserError(
            f"data.split {split}: prepare stores the whole training split and records its folds itself "
            "(--num_folds); drop data.split"
        )
    return data.labelled_splits()


def encode_sample(item: tuple[Any, Any, int | None, int, int, int]) -> dict[str, Any]:
    """One sample of the optimized dataset: `item` is (image path or (H, W, 3) uint8 array, target, size,
    JPEG quality, max pixels, index in the split).

    The image is converted to RGB and, when `size` is set, its shorter side resized to `size` (never
    enlarged); a JPEG source kept at its own resolution is stored as it is, without re-encoding."""
    source, target, size, quality, max_pixels, index = item
    if isinstance(source, np.ndarray):
        side = min(source.shape[:2]) if size is None else min(size, *source.shape[:2])
        rgb = _resize_shorter(Image.fromarray(source), side)
    else:
        with open_image(source, max_pixels) as im:
            w, h = im.size
            if im.format == "JPEG" and im.mode == "RGB" and (size is None or min(w, h) <= size):
                return {"image": Path(source).read_bytes(), "target": target, "index": index}
        with open_image(source, max_pixels) as im:
            rgb = _resize_shorter(im, min(w, h) if size is None else min(size, w, h))
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
    return {"image": buffer.getvalue(), "target": target, "index": index}


def _resize_shorter(im: Image.Image, side: int) -> np.ndarray:
    """The image as RGB with its shorter side resized to `side`, the aspect ratio kept (no crop)."""
    if im.mode.startswith("I") or im.mode == "F":
        im = _high_depth_to_8bit(im)
    if im.mode == "P":
        im = im.convert("RGBA")
    im = im.convert("RGB")
    w, h = im.size
    if min(w, h) != side:
        scale = side / min(w, h)
        im = im.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.Resampling.BILINEAR)
    return np.asarray(im)


def mean_std(items: list[Any], size: int, max_pixels: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in [0, 1] over an even spread of at most STATS_SAMPLES of `items`, files decoded
    at `size` (the statistics of what the network will see, up to the crop), arrays as they are."""
    step = max(1, len(items) // STATS_SAMPLES)
    total = np.zeros(3)
    squares = np.zeros(3)
    pixels = 0
    for item in items[::step][:STATS_SAMPLES]:
        image = item if isinstance(item, np.ndarray) else decode_image(item, size, max_pixels)
        image = image.reshape(-1, 3).astype(np.float64) / 255.0
        total += image.sum(0)
        squares += (image**2).sum(0)
        pixels += len(image)
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 1e-12))
    return mean.tolist(), std.tolist()


def fold_order(source: LabelledSplits, num_folds: int | None) -> tuple[list[int], list[int] | None]:
    """The order the training split is stored in, and the sizes of its folds (None without folds).

    With `num_folds`, the training images are dealt into stratified folds seeded by the source's data.seed
    (as cross-validation's split does for the other DataModules) and stored fold after fold, so that each fold is a
    contiguous range of the split: the DataModule reads a fold, or all but one, as ranges. Within a fold, and
    without folds, the order is a seeded shuffle, so that no chunk holds one class only. A class with fewer
    images than folds leaves the folds out, with a warning."""
    labels = source.splits["train"][1]
    folds: list[list[int]] | None = None
    if num_folds is not None:
        if num_folds < 2:
            raise UserError(f"--num_folds must be at least 2 (or null for no folds), got {num_folds}")
        try:
            check_parts(labels, num_folds, source.targets, "--num_folds")
        except UserError as e:
            warn(f"no folds recorded ({e}); prepare again with a smaller --num_folds to cross-validate")
        else:
            folds = stratified_parts(labels, num_folds, source.seed, source.targets)
    generator = torch.Generator().manual_seed(source.seed)
    order: list[int] = []
    for part in folds if folds is not None else [list(range(len(labels)))]:
        order += [part[i] for i in torch.randperm(len(part), generator=generator).tolist()]
    return order, None if folds is None else [len(f) for f in folds]
