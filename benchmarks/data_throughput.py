"""Data throughput (images/s): the template's batched path vs the per-sample torchvision pipeline.

Peer: ImageFolder + RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize, 2 workers.
Ours: ImageFolderDataModule (images decoded once into the uint8 cache, batches gathered by indexing) with the
same augmentation done batched by `transform_batch` (on the CPU here; on the GPU in training).
Both deliver normalised, augmented float batches of the same size. The cache is built before timing; its
one-time build cost is reported separately.

    python -m benchmarks.data_throughput --root /tmp/cifar10/train
"""

import argparse
from pathlib import Path

from benchmarks.common import Stopwatch, emit, machine, plain_loader
from project.data import ImageFolderDataModule
from project.data.decoded_cache import default_cache_dir


def measure(loader, batches: int, transform=None) -> float:
    it = iter(loader)
    first = next(it)  # worker start-up and first batch are not steady state
    if transform is not None:
        transform(first)
    with Stopwatch() as sw:
        for _ in range(batches):
            batch = next(it)
            if transform is not None:
                batch = transform(batch)
    return batches * batch[0].shape[0] / sw.seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True, help="class folders of CIFAR-10 JPEGs")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both (reduces drift)")
    args = parser.parse_args()
    emit(benchmark="data_throughput", **machine(), batch_size=args.batch_size, batches=args.batches)

    cache_dir = default_cache_dir()  # keyed by the files: built once, reused by every benchmark
    dm = ImageFolderDataModule(
        root=str(args.root),
        image_size=32,
        batch_size=args.batch_size,
        cache_dir=str(cache_dir),
        val_fraction=0.1,
    )
    with Stopwatch() as build:
        dm.setup("fit")
    emit(step="cache_build_once", images=len(dm.train_set) + len(dm.val_set), seconds=round(build.seconds, 1))

    ours, peer = [], []
    for _ in range(args.rounds):
        peer.append(measure(plain_loader(args.root, args.batch_size, num_workers=2), args.batches))
        emit(variant="per-sample torchvision, 2 workers", images_per_s=round(peer[-1]))
        ours.append(measure(dm.train_dataloader(), args.batches, lambda b: dm.transform_batch(b, train=True)))
        emit(variant="template batched path", images_per_s=round(ours[-1]))
    best_ours, best_peer = max(ours), max(peer)
    emit(summary=True, ours_images_per_s=round(best_ours), peer_images_per_s=round(best_peer))
    print(f"ratio: {best_ours / best_peer:.1f}")


if __name__ == "__main__":
    main()
