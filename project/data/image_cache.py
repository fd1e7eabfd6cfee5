"""Decode a list of images once into a memory-mapped uint8 array, reused until the files change.

The cache is keyed by the file paths, sizes, modification times and the target image size: adding,
removing or editing any image rebuilds it. Files are written under a temporary name and renamed into
place, so an interrupted build never leaves a cache that looks complete.
"""

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from project.data.images import DecodeAll
from project.data.tensor_dataset import keep_as_is
from project.errors import UserError
from project.io import atomic_path, atomic_write_text

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "project" / "images"


def cache_key(files: list[Path], size: int) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}:{size}".encode())
    for f in files:
        st = f.stat()
        h.update(f"\n{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def channel_mean_std(chunks: Iterable[torch.Tensor]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std in [0, 1] units over uint8 image batches (N, C, H, W), in float64."""
    total = total_sq = None
    n = 0
    for chunk in chunks:
        x = chunk.double() / 255.0
        s, sq = x.sum(dim=(0, 2, 3)), (x * x).sum(dim=(0, 2, 3))
        total, total_sq = (s, sq) if total is None else (total + s, total_sq + sq)
        n += x.shape[0] * x.shape[2] * x.shape[3]
    if total is None:
        raise UserError("no readable training images to compute the mean and std from")
    mean = total / n
    std = (total_sq / n - mean**2).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


class ImageCache:
    """The decoded images of `files` at `size`x`size`: `.images` (N, 3, size, size) uint8 memmap, `.bad` files.

    Build with `ImageCache.load_or_build(...)`. `bad` maps the index of each unreadable file to the reason.
    """

    def __init__(self, images: np.ndarray, bad: dict[int, str], meta_path: Path) -> None:
        self.images, self.bad, self.meta_path = images, bad, meta_path

    @classmethod
    def load_or_build(
        cls, files: list[Path], size: int, cache_dir: Path, num_workers: int = 0
    ) -> "ImageCache":
        cache_dir.mkdir(parents=True, exist_ok=True)
        key = cache_key(files, size)
        array_path, meta_path = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
        if meta_path.exists() and array_path.exists():  # the json is written last: it marks a complete cache
            meta = json.loads(meta_path.read_text())
            images = np.load(array_path, mmap_mode="r")
            if images.shape == (len(files), 3, size, size):
                return cls(images, {int(k): v for k, v in meta["bad"].items()}, meta_path)
        return cls._build(files, size, array_path, meta_path, num_workers)

    @classmethod
    def _build(
        cls, files: list[Path], size: int, array_path: Path, meta_path: Path, num_workers: int
    ) -> "ImageCache":
        rank_zero_info(
            f"Decoding {len(files)} images at {size}x{size} into the cache {array_path} (once) ..."
        )
        bad: dict[int, str] = {}
        with atomic_path(array_path) as tmp:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(files), 3, size, size))
            loader = DataLoader(
                DecodeAll(files, size), batch_size=256, num_workers=num_workers, collate_fn=keep_as_is
            )
            for batch in loader:
                for i, image, error in batch:
                    if error is None:
                        out[i] = image.transpose(2, 0, 1)
                    else:
                        out[i] = 0
                        bad[i] = error
            out.flush()
            del out
        # Written last: its presence marks a complete cache.
        atomic_write_text(meta_path, json.dumps({"files": len(files), "size": size, "bad": bad, "stats": {}}))
        return cls(np.load(array_path, mmap_mode="r"), bad, meta_path)

    def mean_std(self, indices: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std (in [0, 1]) over the rows `indices`, computed once and kept in the cache."""
        key = hashlib.sha256(indices.numpy().tobytes()).hexdigest()[:16]
        meta = json.loads(self.meta_path.read_text())
        if key not in meta["stats"]:
            chunks = (torch.from_numpy(self.images[c.numpy()]) for c in indices.sort().values.split(4096))
            mean, std = channel_mean_std(chunks)
            meta["stats"][key] = {"mean": mean, "std": std}
            atomic_write_text(self.meta_path, json.dumps(meta))
        stats = meta["stats"][key]
        return tuple(stats["mean"]), tuple(stats["std"])


def drop_bad(indices: list[int], bad: dict[int, str], files: list[Path], skip_corrupt: bool) -> list[int]:
    """Remove unreadable files from `indices`, or stop with an error naming them (unless `skip_corrupt`)."""
    if not bad:
        return indices
    names = [f"{files[i]} ({bad[i]})" for i in sorted(bad)]
    if not skip_corrupt:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        raise UserError(
            f"unreadable image file(s): {'; '.join(names[:3])}{more}. Remove or replace them, "
            f"or set data.skip_corrupt=true to leave them out with a warning."
        )
    rank_zero_warn(f"Leaving out {len(names)} unreadable image(s): {'; '.join(names)}")
    return [i for i in indices if i not in bad]
