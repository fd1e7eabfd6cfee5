"""Decode a list of images once into a memory-mapped uint8 array, reused until the files change.

The cache is keyed by the file paths, sizes, modification times and the target image size: adding,
removing or editing any image rebuilds it (and by whatever else the source adds: the content of a CSV). The array is written under a temporary name and renamed into
place, then the JSON beside it, which marks the cache complete and carries the array's size and CRC-32 per
16 MiB chunk: a truncated, zeroed or otherwise damaged cache is detected when it is loaded, and rebuilt.
"""

import contextlib
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from project.atomic_files import atomic_path, atomic_write_text, check_writable, is_disk_full, no_space_left
from project.data.image_reading import MAX_IMAGE_PIXELS, DecodeAll, check_image
from project.data.tensor_dataset import collate_pre_batched
from project.errors import UserError, warn

CACHE_VERSION = 2
CHUNK = 16 << 20
#: Caches up to this size are checked whole on every load (CRC-32 reads about 4 GB/s); larger ones in samples.
FULL_CHECK_BYTES = 4 << 30
SAMPLED_CHUNKS = 64


def default_cache_dir() -> Path:
    # Under the package's own name: a project renamed from the template keeps a cache of its own.
    package = __name__.partition(".")[0]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / package / "images"


def file_stamps(files: Sequence[str | Path]) -> list[tuple[int, int]]:
    """(size, mtime in ns) of each file, for files that a scan did not stat already."""
    return [(st.st_size, st.st_mtime_ns) for st in (Path(f).stat() for f in files)]


def cache_key(
    files: Sequence[str | Path],
    stamps: list[tuple[int, int]],
    size: int,
    max_pixels: int = MAX_IMAGE_PIXELS,
    source_key: str = "",
) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}:{size}:{max_pixels}:{source_key}".encode())
    h.update("".join(f"\n{f}|{s}|{m}" for f, (s, m) in zip(files, stamps, strict=True)).encode())
    return h.hexdigest()[:24]


def channel_mean_std(chunks: Iterable[torch.Tensor]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std in [0, 1] units over uint8 image batches (N, C, H, W), in float64."""
    total: torch.Tensor | None = None
    total_sq = torch.zeros(())
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


def sampled_mean_std(
    files: Sequence[str | Path],
    size: int,
    cache_dir: Path,
    num_workers: int,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean and std estimated from a fixed sample of up to 2,000 of `files`, decoded at `size` (for datasets
    decoded per image, without the cache), kept in `cache_dir` under the sample's file list."""
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(0))[:2000].tolist()
    sample = [files[i] for i in order]
    key = hashlib.sha256("\n".join(map(str, sorted(sample))).encode() + f"{size}".encode()).hexdigest()[:24]
    path = cache_dir / f"stats-{key}.json"
    if path.exists():
        stats = json.loads(path.read_text())
        return tuple(stats["mean"]), tuple(stats["std"])
    # A generator of its own: building the statistics must not draw from the run's global one (a run that
    # finds them cached would then shuffle and augment differently from one that computes them).
    loader = DataLoader(
        DecodeAll(sample, size, max_pixels),
        batch_size=64,
        num_workers=num_workers,
        collate_fn=collate_pre_batched,
        generator=torch.Generator(),
    )
    images = (
        torch.from_numpy(np.stack([image for _, image, _ in batch if image is not None])).permute(0, 3, 1, 2)
        for batch in loader
        if any(image is not None for _, image, _ in batch)
    )
    mean, std = channel_mean_std(images)
    with contextlib.suppress(OSError):  # a read-only cache: estimated again next time
        atomic_write_text(path, json.dumps({"mean": mean, "std": std}))
    return mean, std


def _chunk_crcs(path: Path, chunks: Iterable[int] | None = None) -> dict[int, int]:
    """CRC-32 of the file's 16 MiB chunks (all, or the given chunk numbers)."""
    crcs = {}
    with open(path, "rb") as f:
        for i in chunks if chunks is not None else range(-(-path.stat().st_size // CHUNK)):
            f.seek(i * CHUNK)
            crcs[i] = zlib.crc32(f.read(CHUNK))
    return crcs


def damage(array_path: Path, meta: dict, shape: tuple[int, ...]) -> str | None:
    """Why the cache files do not hold what the JSON says (size, shape, content), or None when they do."""
    if not array_path.exists():
        return "its array file is missing"
    if array_path.stat().st_size != meta.get("bytes"):
        return f"{array_path.name} has {array_path.stat().st_size} bytes, {meta.get('bytes')} were written"
    crcs = meta.get("crc32") or []
    n = len(crcs)
    if meta["bytes"] <= FULL_CHECK_BYTES:
        chunks = list(range(n))
    else:  # evenly spaced chunks, the first and the last among them
        chunks = sorted({round(i * (n - 1) / (SAMPLED_CHUNKS - 1)) for i in range(SAMPLED_CHUNKS)})
    found = _chunk_crcs(array_path, chunks)
    bad = [i for i in chunks if found[i] != crcs[i]]
    if bad:
        return f"{len(bad)} of {len(found)} checked 16 MiB chunks of {array_path.name} changed (first at byte {bad[0] * CHUNK})"
    try:
        images = np.load(array_path, mmap_mode="r")
    except ValueError as e:
        return f"{array_path.name} is not a readable array ({e})"
    return None if images.shape == shape else f"{array_path.name} holds shape {images.shape}, not {shape}"


def reserve_blocks(path: Path, start: int = 0) -> None:
    """Allocate the disk blocks of the (sparse) file `path` now: an OSError (ENOSPC) here when they do not fit,
    instead of a SIGBUS that kills the process when a write through the memory map finds the disk full. Where
    the file system cannot allocate ahead, its bytes from `start` on (zeros still) are written once."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except AttributeError:  # macOS: no posix_fallocate
            pass
        except OSError as e:
            if is_disk_full(e):
                raise
        # A file system that cannot allocate ahead: every block written once.
        block = b"\0" * CHUNK
        for at in range(start, size, CHUNK):
            os.pwrite(fd, block[: min(CHUNK, size - at)], at)
        os.fsync(fd)
    finally:
        os.close(fd)


class ImageCache:
    """The decoded images of `files` at `size`x`size`: `.images` (N, 3, size, size) uint8 memmap, `.bad` files.

    Build with `ImageCache.load_or_build(...)`. `bad` maps the index of each unreadable file to the reason.
    """

    def __init__(self, images: np.ndarray, bad: dict[int, str], meta_path: Path) -> None:
        self.images, self.bad, self.meta_path = images, bad, meta_path

    @classmethod
    def load_or_build(
        cls,
        files: Sequence[str | Path],
        size: int,
        cache_dir: Path,
        num_workers: int = 0,
        stamps: list[tuple[int, int]] | None = None,
        max_pixels: int = MAX_IMAGE_PIXELS,
        source_key: str = "",
    ) -> "ImageCache":
        """The cache of `files` at `size` in `cache_dir`: loaded when complete and intact, else (re)built.

        `stamps` are the files' (size, mtime) from the scan that found them; stat'ed here when not given.
        `source_key` keys the cache by what else it depends on (a hash of the CSV that lists the files).
        """
        stamps = file_stamps(files) if stamps is None else stamps
        key = cache_key(files, stamps, size, max_pixels, source_key)
        array_path, meta_path = cache_dir / f"{key}.npy", cache_dir / f"{key}.json"
        shape = (len(files), 3, size, size)
        if meta_path.exists():  # the JSON is written last: it marks a complete cache
            try:
                meta = json.loads(meta_path.read_text())
                reason = damage(array_path, meta, shape)
            except (ValueError, KeyError, TypeError, IndexError) as e:
                reason = f"{meta_path.name} is unreadable ({type(e).__name__}: {e})"
            if reason is None:
                images = np.load(array_path, mmap_mode="r")
                return cls(images, {int(k): v for k, v in meta["bad"].items()}, meta_path)
            warn(f"the image cache {array_path} is damaged ({reason}); rebuilding it")
        check_writable(
            cache_dir, "data.cache_dir", hint="or decode images in the loader with --data.cache false"
        )
        try:
            return cls._build(files, size, array_path, meta_path, num_workers, max_pixels)
        except OSError as e:
            if not is_disk_full(e):
                raise
            needed = len(files) * 3 * size * size / 2**20
            raise UserError(
                no_space_left(
                    f"the image cache {array_path} ({needed:,.1f} MB)",
                    "nothing was left there",
                    "Free some space, choose another folder with --data.cache_dir, or decode the images in the "
                    "loader with --data.cache false",
                )
            ) from None

    @classmethod
    def _build(
        cls,
        files: Sequence[str | Path],
        size: int,
        array_path: Path,
        meta_path: Path,
        num_workers: int,
        max_pixels: int,
    ) -> "ImageCache":
        rank_zero_info(
            f"Decoding {len(files)} images at {size}x{size} into the cache {array_path} (once) ..."
        )
        bad: dict[int, str] = {}
        with atomic_path(array_path) as tmp:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(files), 3, size, size))
            reserve_blocks(tmp, out.offset)
            loader = DataLoader(
                DecodeAll(files, size, max_pixels),
                batch_size=256,
                num_workers=num_workers,
                collate_fn=collate_pre_batched,
                generator=torch.Generator(),  # not the run's global one (see sampled_mean_std)
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
            crcs = _chunk_crcs(tmp)
        meta = {
            "files": len(files),
            "size": size,
            "bad": bad,
            "stats": {},
            "bytes": array_path.stat().st_size,
        }
        meta["crc32"] = [crcs[i] for i in range(len(crcs))]
        atomic_write_text(meta_path, json.dumps(meta))  # last: its presence marks a complete cache
        return cls(np.load(array_path, mmap_mode="r"), bad, meta_path)

    def mean_std(self, indices: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std (in [0, 1]) over the rows `indices`, computed once and kept in the cache."""
        key = hashlib.sha256(indices.numpy().tobytes()).hexdigest()[:16]
        meta = json.loads(self.meta_path.read_text())
        if key not in meta["stats"]:
            chunks = (torch.from_numpy(self.images[c.numpy()]) for c in indices.sort().values.split(4096))
            mean, std = channel_mean_std(chunks)
            meta["stats"][key] = {"mean": mean, "std": std}
            with contextlib.suppress(OSError):  # a read-only cache: computed again next time
                atomic_write_text(self.meta_path, json.dumps(meta))
        stats = meta["stats"][key]
        return tuple(stats["mean"]), tuple(stats["std"])


def drop_bad(
    indices: list[int], bad: dict[int, str], files: Sequence[str | Path], skip_corrupt: bool
) -> list[int]:
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
    warn(
        f"leaving out {len(names)} unreadable image(s): {'; '.join(names[:10])}"
        + (" ..." if len(names) > 10 else "")
    )
    return [i for i in indices if i not in bad]


def readable_files(files: Sequence[Path], max_pixels: int, skip_corrupt: bool) -> list[Path]:
    """`files` (to predict: nothing is cached) checked before any is decoded (a header check and PIL's
    `verify`, no full decode): every unreadable one named in one error, or all left out with one warning."""
    bad = {i: reason for i, f in enumerate(files) if (reason := check_image(f, max_pixels))}
    return [files[i] for i in drop_bad(list(range(len(files))), bad, files, skip_corrupt)]
