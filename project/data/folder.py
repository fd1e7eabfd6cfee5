"""`ImageFolderDataModule`: custom datasets laid out as one folder per class."""

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import Dataset

from project.data.datamodule import ImageDataModule, available_cpus
from project.data.folds import KFoldMixin, check_folder_folds
from project.data.image_cache import ImageCache, default_cache_dir, drop_bad, sampled_mean_std
from project.data.images import (
    MAX_IMAGE_PIXELS,
    ClassFolders,
    ImageFileDataset,
    check_image,
    list_images,
    scan_class_folders,
)
from project.data.tensor_dataset import TensorImageDataset
from project.errors import UserError


class ImageFolderDataModule(KFoldMixin, ImageDataModule):
    """Images in class folders, of any size and mode, resized once to `image_size` and cached.

    Layouts (class names come from the folder names, sorted):
      - `root/train/<class>/*` with optional `root/val/<class>/*` and `root/test/<class>/*`;
      - or `root/<class>/*`, split into train/val by `val_fraction` (stratified, seeded).
    Without `root/val`, validation is split off the training folder. Files with other extensions are skipped.

    Every image is converted to RGB (grayscale, RGBA and palette images too), its shorter side resized to
    `image_size` and centre-cropped. With `cache: true` (default) this happens once: the images land in a
    memory-mapped uint8 file in `cache_dir`, rebuilt only when files are added, removed or changed, and
    batches are gathered from it like from CIFAR's in-memory tensor. `cache: false` decodes every image in
    the loader workers each epoch (for datasets too large for the disk cache).

    Args:
        root: Dataset folder (see the layouts above).
        image_size: Side of the square images the network sees.
        val_fraction: Fraction of each class held out for validation when there is no `root/val`.
        cache: Decode once into the memory-mapped cache (fast) instead of every epoch.
        cache_dir: Where the cache lives. Default: `$XDG_CACHE_HOME/project/images` (`~/.cache/...`).
        skip_corrupt: Leave unreadable image files out with a warning instead of stopping with an error.
        max_image_pixels: Largest width x height decoded; a larger image (a decompression bomb, say) counts as
            unreadable.
        mean: Per-channel mean in [0, 1]; default: computed once over the training images (and cached).
        std: Per-channel std in [0, 1]; default: computed with the mean.
        predict_root: A folder of unlabeled images (any depth) for `predict`; default `root/test` if it
            exists, else the validation split.
        crop_padding: Padding of the training random crop; default `image_size // 8` (4 at 32 pixels).
        **kwargs: `num_folds` and `fold` (k-fold cross-validation over the training images, see `KFoldMixin`),
            and the loader and augmentation settings of `ImageDataModule` (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        root: str,
        image_size: int = 64,
        val_fraction: float = 0.1,
        cache: bool = True,
        cache_dir: str | None = None,
        skip_corrupt: bool = False,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        predict_root: str | None = None,
        crop_padding: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(crop_padding=image_size // 8 if crop_padding is None else crop_padding, **kwargs)
        if image_size < 1:
            raise UserError(f"data.image_size must be at least 1, got {image_size}")
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise UserError(f"data.root {self.root} does not exist or is not a directory")
        self.image_size = image_size
        self.cache = cache
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.skip_corrupt = skip_corrupt
        self.max_image_pixels = max_image_pixels
        self.predict_root = Path(predict_root).expanduser() if predict_root else None
        split_layout = (self.root / "train").is_dir()
        train_dir = self.root / "train" if split_layout else self.root
        self._scans = {"train": scan_class_folders(train_dir)}
        self.train_files, self.train_labels, self._classes = self._scans["train"][:3]
        self._caches: dict[str, ImageCache] = {}
        val_dir, test_dir = self.root / "val", self.root / "test"
        self.val_dir = val_dir if split_layout and val_dir.is_dir() else None
        self.test_dir = test_dir if split_layout and test_dir.is_dir() else None
        if self.val_dir is None and not 0.0 < val_fraction < 1.0:
            raise UserError(
                f"data.val_fraction must be in (0, 1) when there is no {val_dir}, got {val_fraction}"
            )
        self.val_fraction = val_fraction
        check_folder_folds(self.num_folds, self.fold, self.train_labels, self._classes, self.val_dir)
        self._given_stats = (mean, std) if mean is not None and std is not None else None
        if self._given_stats:
            self.mean, self.std = mean, std

    @property
    def class_names(self) -> list[str]:
        return self._classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    # -- building the splits --------------------------------------------------------------------------------
    def _workers(self) -> int:
        return min(8, available_cpus()) if self.num_workers is None else self.num_workers

    def _scan(self, split: str) -> ClassFolders:
        if split not in self._scans:
            self._scans[split] = scan_class_folders(self.root / split, self._classes)
        return self._scans[split]

    def _cache(self, split: str) -> ImageCache:
        """The decoded images of a split's folder, loaded (or built) once per process."""
        if split not in self._caches:
            scan, size, pixels = self._scan(split), self.image_size, self.max_image_pixels
            build = (scan.files, size, self.cache_dir, self._workers(), scan.stamps, pixels)
            self._caches[split] = ImageCache.load_or_build(*build)
        return self._caches[split]

    def _dataset(self, split: str, indices: list[int] | None = None) -> Dataset:
        """The images of the folder `split` (train, val, test), or the rows `indices` of it."""
        files, labels = self._scan(split).files, self._scan(split).labels
        indices = list(range(len(files))) if indices is None else indices
        if self.cache:
            cached = self._cache(split)
            keep = drop_bad(indices, cached.bad, files, self.skip_corrupt)
            return TensorImageDataset(cached.images, labels, keep)
        if self.skip_corrupt:
            bad = {i: reason for i in indices if (reason := check_image(files[i], self.max_image_pixels))}
            indices = drop_bad(indices, bad, files, skip_corrupt=True)
        return ImageFileDataset(
            [files[i] for i in indices], [labels[i] for i in indices], self.image_size, self.max_image_pixels
        )

    def _split(self) -> tuple[list[int], list[int]]:
        """Stratified, seeded split of the training folder: (train indices, val indices)."""
        if self.num_folds is not None:
            return self.fold_indices(self.train_labels)
        g = torch.Generator().manual_seed(self.seed)
        labels = torch.tensor(self.train_labels)
        train_idx, val_idx = [], []
        for c in range(len(self._classes)):
            idx = (labels == c).nonzero().flatten()
            idx = idx[torch.randperm(len(idx), generator=g)].tolist()
            n_val = min(len(idx) - 1, max(1, round(self.val_fraction * len(idx)))) if len(idx) > 1 else 0
            val_idx += idx[:n_val]
            train_idx += idx[n_val:]
        return sorted(train_idx), sorted(val_idx)

    def setup(self, stage: str) -> None:
        if self.train_set is None:
            train_idx, val_idx = (None, None) if self.val_dir else self._split()
            self.train_set = self._dataset("train", train_idx)
            self.val_set = self._dataset("val") if self.val_dir else self._dataset("train", val_idx)
            if not self._given_stats:
                self.mean, self.std = self._train_stats()
        if stage == "test" and self.test_set is None:
            if self.test_dir:
                self.test_set = self._dataset("test")
            else:
                rank_zero_warn(f"No test folder {self.root / 'test'}: testing on the validation split.")
                self.test_set = self.val_set
        if stage == "predict" and self.predict_set is None:
            folder = self.predict_root or self.test_dir
            if folder is not None:
                files = list_images(folder)
                if not files:
                    raise UserError(f"prediction folder {folder} contains no images")
            else:
                files = [self.train_files[i] for i in self._split()[1]]
            self.predict_set = ImageFileDataset(files, None, self.image_size, self.max_image_pixels)
            self.predict_names = [str(f) for f in files]

    def _train_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        ds = self.train_set
        if isinstance(ds, TensorImageDataset):
            return self._cache("train").mean_std(ds.indices)
        return sampled_mean_std(
            ds.files, self.image_size, self.cache_dir, self._workers(), self.max_image_pixels
        )
