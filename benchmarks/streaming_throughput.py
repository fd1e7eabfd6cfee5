"""Streaming throughput (images/s over one epoch of the training split) and sizes on disk.

Three ways to feed the same training images, each delivering uint8 (B, 3, S, S) batches (augmentation, which is
the same batched step for all three, is left out):
  - litdata chunks prepared by `python -m project prepare` (`StreamingImageDataModule`): JPEG decoded and
    resized in the loader workers;
  - the folder cache (`ImageFolderDataModule`, `cache: true`): decoded once into a memory-mapped file, batches
    gathered by indexing;
  - per-image decoding (`ImageFolderDataModule`, `cache: false`): every file opened and decoded each epoch;
with 0, 1 and 2 loader workers each. Also: `prepare`'s own images/s, and the bytes on disk of the source
folder, the prepared chunks and the folder cache.

    python -m benchmarks.streaming_throughput --root /tmp/cifar10 --image-size 32 --size 32
    python -m benchmarks.streaming_throughput --root path/to/photos --image-size 224 --size 256
"""

import argparse
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import Stopwatch, emit, machine
from project.data import ImageFolderDataModule
from project.streaming.prepare import prepare
from project.streaming.source import StreamingImageDataModule


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def epoch_images_per_s(data, batches: int | None) -> tuple[float, int]:
    """(images/s, images) of one pass over the training loader, from its second batch (worker start-up and
    the first batch are not steady state)."""
    data.setup("fit")
    it = iter(data.train_dataloader())
    next(it)
    images = 0
    with Stopwatch() as sw:
        for i, (x, _) in enumerate(it):
            images += x.shape[0]
            if batches is not None and i + 1 >= batches:
                break
    return images / max(sw.seconds, 1e-9), images


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True, help="class folders (or root/train, root/val)")
    parser.add_argument("--image-size", type=int, default=32, help="side of the images the network sees")
    parser.add_argument(
        "--size", type=int, default=None, help="prepare's stored shorter side (default: source)"
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=None, help="stop each pass after this many batches")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prepare-workers", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary folder, removed")
    args = parser.parse_args()
    emit(benchmark="streaming_throughput", **machine(), root=str(args.root), image_size=args.image_size)

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="streaming-bench-"))
    prepared, cache = work / "prepared", work / "cache"
    source = [
        "--config",
        "configs/folder.yaml",
        "--data.root",
        str(args.root),
        "--data.cache_dir",
        str(cache),
    ]
    source += ["--data.image_size", str(args.image_size)]
    try:
        with Stopwatch() as sw:
            meta = prepare(
                str(prepared),
                size=args.size,
                num_workers=args.prepare_workers,
                overwrite=True,
                fit_args=source,
            )
        total = sum(meta["splits"].values())
        emit(
            step="prepare", images=total, seconds=round(sw.seconds, 1), images_per_s=round(total / sw.seconds)
        )

        common = dict(image_size=args.image_size, batch_size=args.batch_size, persistent_workers=False)
        cached = ImageFolderDataModule(root=str(args.root), cache_dir=str(cache), **common)  # pyright: ignore[reportArgumentType]
        with Stopwatch() as sw:
            cached.setup("fit")  # builds the folder cache once, outside the timed passes
        emit(step="folder_cache_build", seconds=round(sw.seconds, 1))
        emit(
            bytes_source=folder_bytes(args.root),
            bytes_prepared=folder_bytes(prepared),
            bytes_folder_cache=folder_bytes(cache),
        )
        for workers in args.workers:
            variants = {
                "litdata chunks": lambda w=workers: StreamingImageDataModule(
                    str(prepared),
                    num_workers=w,
                    **common,  # pyright: ignore[reportArgumentType]
                ),
                "folder cache": lambda w=workers: ImageFolderDataModule(
                    root=str(args.root),
                    cache_dir=str(cache),
                    num_workers=w,
                    **common,  # pyright: ignore[reportArgumentType]
                ),
                "per-image decoding": lambda w=workers: ImageFolderDataModule(
                    root=str(args.root),
                    cache=False,
                    cache_dir=str(cache),
                    num_workers=w,
                    **common,  # pyright: ignore[reportArgumentType]
                ),
            }
            for name, make in variants.items():
                rate, images = epoch_images_per_s(make(), args.batches)
                emit(variant=name, workers=workers, images=images, images_per_s=round(rate))
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
