"""A dataset held in memory as one uint8 tensor, read a whole batch at a time."""

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset


class TensorImageDataset(Dataset):
    """Images (N, C, H, W) uint8 plus one target per image: an int64 label, a float32 multi-hot row for
    multi-label data, or the index for prediction.

    The DataLoader's fetcher calls `__getitems__` with all of a batch's indices, so a batch is a single
    gather from the big tensor: no per-sample PIL work, no per-sample collate. `images` may also be a
    read-only numpy memmap (the image-folder cache), in which case only the batch's rows are read.

    Args:
        images: (N, C, H, W) uint8 tensor or numpy array.
        targets: (N,) labels, or a tensor of per-image targets kept as it is (float32 (N, tags) multi-hot
            rows for multi-label data), or None to yield each sample's index instead (prediction).
        indices: Optional subset of rows (a train/val split) without copying the images.
        sample_transform: Optional per-image transform on uint8 (C, H, W) tensors, e.g. TrivialAugmentWide;
            it runs in the DataLoader workers. Its random draws come from a generator seeded per batch from
            `seed` and the batch's rows in order, so they are the same with any number of workers and after a
            resume (the process's own generator is left as it was).

    Set `return_rows` to get `(images, targets, rows)` batches: each image's row in `images`, which stays the
    same across epochs and splits (augmentations that follow an image from epoch to epoch need it).
    """

    #: Seed of the per-batch random draws of `sample_transform`.
    seed: int = 0

    def __init__(
        self,
        images: Tensor | np.ndarray,
        targets: Sequence[int] | Tensor | None = None,
        indices: Sequence[int] | Tensor | None = None,
        sample_transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.images = images
        n = len(images)
        self.indices = torch.as_tensor(indices if indices is not None else range(n), dtype=torch.long)
        if targets is not None and not isinstance(targets, Tensor):
            targets = torch.as_tensor(targets, dtype=torch.long)  # a list of labels
        self.targets = targets
        self.sample_transform = sample_transform
        self.return_rows = False

    def to(self, device: torch.device | str) -> "TensorImageDataset":
        """Hold everything on `device` (a memmap is read into memory first); batches are then gathered there."""
        if isinstance(self.images, np.ndarray):
            self.images = torch.from_numpy(np.array(self.images))  # a writable copy in memory, not the file
        self.images = self.images.to(device)
        self.indices = self.indices.to(device)
        self.targets = None if self.targets is None else self.targets.to(device)
        return self

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, positions: list[int]) -> tuple[Tensor, ...]:
        rows = self.indices[torch.as_tensor(positions, device=self.indices.device)]
        if isinstance(self.images, np.ndarray):
            order = rows.argsort()  # sorted reads are sequential on a memmap
            x = torch.empty((len(rows), *self.images.shape[1:]), dtype=torch.uint8)
            x[order] = torch.from_numpy(np.ascontiguousarray(self.images[rows[order].numpy()]))
        else:
            x = self.images[rows]
        if self.sample_transform is not None:
            with torch.random.fork_rng(devices=[]):  # transforms draw from the global CPU generator
                torch.manual_seed(batch_seed(self.seed, rows))
                x = torch.stack([self.sample_transform(img) for img in x])
        y = self.targets[rows] if self.targets is not None else rows
        return (x, y, rows) if self.return_rows else (x, y)

    def __getitem__(self, position: int) -> tuple[Tensor, ...]:
        return tuple(t[0] for t in self.__getitems__([position]))


def batch_seed(seed: int, rows: Tensor) -> int:
    """A seed for one batch's random draws: a function of `seed` and the batch's rows in their order (an epoch's
    shuffle gives every batch its own)."""
    return zlib.crc32(rows.cpu().numpy().tobytes(), seed & 0xFFFFFFFF)


def collate_pre_batched(batch: Any) -> Any:
    """A collate_fn that hands the batch on unchanged: `__getitems__` has collated it already (or the samples
    are kept as a list). Module-level, so it pickles into DataLoader workers."""
    return batch
