"""`ImageFilesDataModule`: labelled image files, wherever their labels come from, decoded once and cached.

What every source of labelled images needs beyond its list of files lives here: decoding any size and mode, the
cache, the validation split, statistics from the training part only, the unreadable-file and decompression-bomb
guards, a prediction folder. The source it holds (`project.data.file_source`) says where files and labels are.
"""

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from project.data.datamodule import ImageDataModule, LabelledSplits
from project.data.decoded_cache import (
    ImageCache,
    default_cache_dir,
    drop_bad,
    readable_files,
    sampled_mean_std,
)
from project.data.file_source import FileSource
from project.data.image_reading import (
    MAX_IMAGE_PIXELS,
    ImageFileDataset,
    Label,
    LabelledFiles,
    check_image,
    list_images,
)
from project.data.label_checks import check_class_names
from project.data.splits import HoldOut, ValidationSplit
from project.data.targets import TargetKind
from project.data.tensor_dataset import TensorImageDataset
from project.errors import UserError, warn
from project.machine import available_cpus

#: Largest `image_size`: one 8192 x 8192 RGB image is 200 MB as uint8 and 800 MB as the float32 the network
#: sees; larger ones are a typo (or a whole-slide image, which wants tiles, not one input).
MAX_IMAGE_SIZE = 8192


class ImageFilesDataModule(ImageDataModule):
    """Labelled image files of any size and mode, resized once to `image_size` and cached.

    The `source` lists the files of `train`, `val` and `test` (None: no such split; validation is then split
    off the training files, testing falls back to validation) and the kind of its labels. Constructing reads
    nothing: the training split is scanned and checked when first asked for (the data -> model links do).

    Every image is converted to RGB, its shorter side resized to `image_size` and centre-cropped: with `cache`
    once, into a memory-mapped uint8 file rebuilt when files change, gathered like CIFAR's in-memory tensor;
    without, in the loader workers every epoch (for data too large for the disk cache).

    Args:
        source: Where the files and their labels are (`ClassFolders`, a registered source, or one of your own).
        image_size: Side of the square images the network sees (at most 8192).
        val_fraction: Fraction of each class held out for validation when the source has no validation split.
        cache: Decode once into the memory-mapped cache (fast) instead of every epoch.
        cache_dir: Where the cache lives. Default: `$XDG_CACHE_HOME/project/images` (`~/.cache/...`).
        skip_corrupt: Leave unreadable image files out with a warning instead of stopping with an error.
        max_image_pixels: Largest width x height decoded; a larger image (a decompression bomb) is unreadable.
        mean: Per-channel mean in [0, 1]; default: computed once over the training images (and cached).
        std: Per-channel std in [0, 1]; default: computed with the mean.
        predict_root: A folder of unlabeled images (any depth) for `predict`; default: test, else validation.
        cache_size: Side of the squares cached (or decoded), when larger than `image_size`: batches are resized
            (or cropped, by `crop_scale`) to `image_size` on the device. Default: `image_size`.
        source_scale: That side as a multiple of `image_size` instead (1.5: 96 px at 64), so a recipe's source
            grows with its input; give it or `cache_size`, not both.
        split: Which training images validate when the source has no validation split (a `ValidationSplit`,
            seeded by `seed`). Default: a stratified hold-out of `val_fraction`.
        **kwargs: The loader and augmentation settings of `ImageDataModule` (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        source: FileSource,
        image_size: int = 64,
        val_fraction: float = 0.1,
        cache: bool = True,
        cache_dir: str | None = None,
        skip_corrupt: bool = False,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        predict_root: str | None = None,
        cache_size: int | None = None,
        source_scale: float | None = None,
        split: ValidationSplit | None = None,
        **kwargs: Any,
    ) -> None:
        if not 1 <= image_size <= MAX_IMAGE_SIZE:  # before crop_padding, which defaults to a share of it
            raise UserError(
                f"data.image_size must be between 1 and {MAX_IMAGE_SIZE} pixels (the side of the square every "
                f"image is resized to), got {image_size}"
            )
        if cache_size is not None and source_scale is not None:
            raise UserError(
                f"data.cache_size={cache_size} and data.source_scale={source_scale} both set the side of the cached "
                "squares: give one (after a preset that sets source_scale, add --data.source_scale null)"
            )
        if source_scale is not None:
            if not 1.0 <= source_scale <= MAX_IMAGE_SIZE / image_size:
                raise UserError(
                    f"data.source_scale must be between 1 and {MAX_IMAGE_SIZE / image_size:g} (the cached side "
                    f"over image_size={image_size}, at most {MAX_IMAGE_SIZE} pixels), got {source_scale}"
                )
            cache_size = round(image_size * source_scale)
        if cache_size is not None and not image_size <= cache_size <= MAX_IMAGE_SIZE:
            raise UserError(
                f"data.cache_size must be between image_size={image_size} and {MAX_IMAGE_SIZE}, got {cache_size}"
            )
        super().__init__(**kwargs)
        self.source = source
        self.split = split
        self.image_size = image_size
        #: The side of the images stored (and read): the network's input, or the larger source it is cut from.
        self.source_size: int = cache_size or image_size
        self.cache = cache
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.skip_corrupt = skip_corrupt
        self.max_image_pixels = max_image_pixels
        self.predict_root = Path(predict_root).expanduser() if predict_root else None
        self._scans: dict[str, LabelledFiles | None] = {}
        self._caches: dict[str, ImageCache] = {}
        self._bad: dict[str, dict[int, str]] = {}  # unreadable files of a split, without the cache
        self._bad_told: set[str] = set()  # the splits whose unreadable files were named
        self.val_fraction = val_fraction
        self._given_stats = mean is not None and std is not None
        if mean is not None and std is not None:
            self.mean, self.std = tuple(mean), tuple(std)

    def _check(self, train: LabelledFiles) -> None:
        """What the training split's scan decides, checked once, before anything is built from it: the label
        names, the other splits' labels against training's, and the validation split."""
        counts = self.targets.counts(train.labels)
        if counts is not None:  # names that group images (classes, tags), not the names of values
            check_class_names(train.classes, counts, self.source.labels_source(), self.targets.noun)
        has_val = self.scanned("val") is not None
        self.scanned("test")  # its labels checked against training's now, not after the whole fit
        if not has_val and not 0.0 < self.val_fraction < 1.0:
            raise UserError(
                "data.val_fraction must be in (0, 1) when the data has no validation split, got "
                f"{self.val_fraction}"
            )
        if self.split is not None:
            if has_val:
                raise UserError(self.source.split_with_val_split(self.split))
            self.split.check(train.labels, self.targets)

    # -- what the model needs to know ----------------------------------------------------------------------------
    @property
    def class_names(self) -> list[str]:
        return self.scanned("train").classes

    @property
    def targets(self) -> TargetKind:
        return self.source.target_kind(tuple(self.class_names))

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    @property
    def train_files(self) -> list[str]:
        """The training split's files (before any validation split), in the order of its labels."""
        return self.scanned("train").files

    @property
    def train_labels(self) -> list[Label]:
        """The labels of `train_files`: class indices, each image's tag indices, or its values."""
        return self.scanned("train").labels

    @property
    def train_targets(self) -> torch.Tensor:
        """The encoded targets of the part that trains (after the validation split): what a task
        derives its loss's weights or scale from."""
        labels = self.train_labels
        rows = range(len(labels)) if self.has_split("val") else self._split()[0]
        return self.targets.encode([labels[i] for i in rows])

    # -- building the splits --------------------------------------------------------------------------------
    def scanned(self, split: str) -> Any:
        """The source's scan of `split`, once per split (typed loosely: `train` is never None). Nothing is read
        before the first call: the data -> model links ask for the class names, which scans the training split
        and checks it."""
        if split not in self._scans:
            train = None if split == "train" else self.scanned("train")
            self._scans[split] = self.source.scan(split, train)
            if split == "train":
                try:
                    self._check(self._scans[split])  # pyright: ignore[reportArgumentType]  # train: never None
                except BaseException:
                    del self._scans[split]  # checked again, and refused again, on the next call
                    raise
        return self._scans[split]

    def has_test_split(self) -> bool:
        return self.has_split("test")

    def has_split(self, split: str) -> bool:
        return self.scanned(split) is not None

    def _workers(self) -> int:
        return min(8, available_cpus()) if self.num_workers is None else self.num_workers

    def _cache(self, split: str) -> ImageCache:
        """The decoded images of a split, loaded (or built) once per process."""
        if split not in self._caches:
            scan, size, pixels = self.scanned(split), self.source_size, self.max_image_pixels
            build = (scan.files, size, self.cache_dir, self._workers(), scan.stamps, pixels, scan.source_key)
            self._caches[split] = ImageCache.load_or_build(*build)
        return self._caches[split]

    def _dataset(self, split: str, indices: list[int] | None = None, train: bool = False) -> Dataset:
        """The images of `split` (train, val, test), or the rows `indices` of it; `train`: the training set."""
        files = self.scanned(split).files
        targets = self.targets.encode(self.scanned(split).labels)
        indices = list(range(len(files))) if indices is None else indices
        augment = self.augment.sample_transform() if split == "train" and train else None
        if self.cache:
            cached = self._cache(split)  # images only: the targets come from the scan, every time
            keep = self._drop_bad(split, indices, cached.bad, files)
            return TensorImageDataset(cached.images, targets, keep, sample_transform=augment)
        if self.skip_corrupt:
            if (
                split not in self._bad
            ):  # the whole split at once: its training and validation parts told together
                self._bad[split] = {
                    i: reason
                    for i in range(len(files))
                    if (reason := check_image(files[i], self.max_image_pixels))
                }
            indices = self._drop_bad(split, indices, self._bad[split], files)
        kept = [files[i] for i in indices]
        return ImageFileDataset(kept, targets[indices], self.source_size, self.max_image_pixels, augment)

    def labelled_splits(self) -> LabelledSplits:
        """The image files and labels of train, val (the data's own, or the seeded validation split) and test
        where there is one, without the files that cannot be read (an error, or a warning with skip_corrupt)."""
        train = self.scanned("train")
        rows: dict[str, tuple[Any, list[int] | None]]  # split -> its scan, and the rows of it (None: all)
        if self.has_split("val"):
            rows = {"train": (train, None), "val": (self.scanned("val"), None)}
        else:
            train_idx, val_idx = self._split()
            rows = {"train": (train, train_idx), "val": (train, val_idx)}
        if self.has_split("test"):
            rows["test"] = (self.scanned("test"), None)
        splits: dict[str, tuple[list[Any], list[Any]]] = {}
        for split, (scan, indices) in rows.items():
            indices = list(range(len(scan.files)) if indices is None else indices)
            pixels = self.max_image_pixels
            bad = {i: why for i in indices if (why := check_image(Path(scan.files[i]), pixels))}
            keep = drop_bad(indices, bad, scan.files, self.skip_corrupt)
            splits[split] = ([scan.files[i] for i in keep], [scan.labels[i] for i in keep])
        name, size = type(self).__name__, self.image_size
        return LabelledSplits(
            self.class_names, self.targets, splits, self.max_image_pixels, size, self.seed, name
        )

    def _drop_bad(self, split: str, indices: list[int], bad: dict[int, str], files: list[str]) -> list[int]:
        """`indices` without the unreadable files `bad` of their split: an error naming them (without
        `skip_corrupt`), else a warning naming all of the split's, once (not again for its validation part)."""
        if split in self._bad_told:
            return [i for i in indices if i not in bad]
        self._bad_told.add(split)
        return drop_bad(indices, bad, files, self.skip_corrupt)

    def _split(self) -> tuple[list[int], list[int]]:
        """(train indices, val indices) of the training files: `split`'s, or the hold-out of `val_fraction`."""
        split = self.split or HoldOut(self.val_fraction)
        return split.split(self.scanned("train").labels, self.seed, self.targets)

    def setup(self, stage: str) -> None:
        if self.train_set is None:
            has_val = self.has_split("val")
            train_idx, val_idx = (None, None) if has_val else self._split()
            self.train_set = self._dataset("train", train_idx, train=True)
            self.val_set = self._dataset("val") if has_val else self._dataset("train", val_idx)
            if not self._given_stats:
                self.mean, self.std = self._train_stats()
        if stage == "test" and self.test_set is None:
            if self.has_split("test"):
                self.test_set = self._dataset("test")
            else:
                warn(
                    "the data has no test split: testing on the validation split, which chose the best "
                    "checkpoint; for a held-out score give it a test split (root/test/<class>/ beside "
                    "root/train/)"
                )
                self.test_set, self.tested_split = self.val_set, "validation"
        if stage == "predict" and self.predict_set is None:
            files = readable_files(self.predict_files(), self.max_image_pixels, self.skip_corrupt)
            self.predict_set = ImageFileDataset(files, None, self.source_size, self.max_image_pixels)
            self.predict_names = [str(f) for f in files]

    def predict_files(self) -> list[Path]:
        """The images `predict` reads: those the source names, else `predict_root`, else the test split, else
        the validation split."""
        if (named := self.source.predict_files()) is not None:
            return named
        if self.predict_root is not None:
            files = list_images(self.predict_root)
            if not files:
                raise UserError(f"prediction folder {self.predict_root} contains no images")
            return files
        split = "test" if self.has_split("test") else "validation"
        if split == "test":
            files = [Path(f) for f in self.scanned("test").files]
        else:
            files = [Path(self.scanned("train").files[i]) for i in self._split()[1]]
        warn(f"no data.predict_root given: predicting the {split} split ({len(files)} images)")
        return files

    def _train_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        ds = self.train_set
        if isinstance(ds, TensorImageDataset):
            return self._cache("train").mean_std(ds.indices)
        assert isinstance(ds, ImageFileDataset)  # what _dataset builds without the cache
        return sampled_mean_std(
            ds.files, self.source_size, self.cache_dir, self._workers(), self.max_image_pixels
        )
