"""A source of another shape, written the way a user would: one `ImageDataModule` subclass whose datasets are
streams (`IterableDataset`s that deal their own samples to the loader's workers and to the processes, as a
reader of a database, a message queue or a camera does), and nothing else. The loaders, the on-device
augmentation and normalisation, and the checkpointed settings come from `ImageDataModule`; the sources'
contract suite checks it like the shipped ones."""

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from project.data import ImageDataModule

CLASSES = ("dark", "bright")


class ShadeStream(IterableDataset):
    """`count` (3, size, size) uint8 images made from their number: noise, brightened for class 1. Each loader
    worker of each process takes every n-th image, so together they yield each image once."""

    def __init__(self, count: int, size: int, seed: int, with_index: bool = False) -> None:
        self.count, self.size, self.seed, self.with_index = count, size, seed, with_index

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        processes, rank = 1, 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            processes, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        for i in range(rank * workers + worker, self.count, processes * workers):
            label = i % len(CLASSES)
            noise = torch.rand(
                3, self.size, self.size, generator=torch.Generator().manual_seed(self.seed + i)
            )
            image = (noise * 127 + 128 * label).to(torch.uint8)
            yield image, i if self.with_index else label


class ShadeStreamDataModule(ImageDataModule):
    """Dark and bright noise images, streamed.

    Args:
        images: Images in each split.
        image_size: Side of the square images.
        **kwargs: The loader and augmentation settings of `ImageDataModule` (batch_size, num_workers, ...).
    """

    def __init__(self, images: int = 24, image_size: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.images, self.image_size = images, image_size
        self.mean, self.std = (0.5, 0.5, 0.5), (0.3, 0.3, 0.3)

    @property
    def class_names(self) -> list[str]:
        return list(CLASSES)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    def setup(self, stage: str) -> None:
        def stream(offset: int, with_index: bool = False) -> ShadeStream:
            return ShadeStream(self.images, self.image_size, self.seed + offset, with_index)

        self.train_set, self.val_set, self.test_set = stream(0), stream(10_000), stream(20_000)
        self.predict_set = stream(20_000, with_index=True)
        self.predict_names = [f"stream/{i}" for i in range(self.images)]
