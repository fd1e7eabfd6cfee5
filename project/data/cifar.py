"""`CIFARDataModule`: CIFAR-10/100 held in memory as one uint8 tensor."""

import contextlib
from pathlib import Path
from typing import Any, Literal

import torch
from torchvision import datasets

from project.data.datamodule import ImageDataModule, LabelledSplits
from project.data.decoded_cache import channel_mean_std
from project.data.image_reading import MAX_IMAGE_PIXELS
from project.data.splits import ValidationSplit
from project.data.tensor_dataset import TensorImageDataset
from project.errors import UserError

_DATASETS = {
    "cifar10": (
        datasets.CIFAR10,
        "cifar-10-python.tar.gz",
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
    ),
    "cifar100": (
        datasets.CIFAR100,
        "cifar-100-python.tar.gz",
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
    ),
}
_TRAIN_SIZE = 50_000
# The label order of torchvision's CIFAR10.classes / CIFAR100.classes, known before any file is read so
# the CLI can link class names to the model before the data is downloaded.
_CIFAR10 = "airplane automobile bird cat deer dog frog horse ship truck"
_CIFAR100 = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly "
    "camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup "
    "dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower "
    "leopard lion lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid "
    "otter palm_tree pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray "
    "road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel streetcar "
    "sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle "
    "wardrobe whale willow_tree wolf woman worm"
)
_CLASSES = {"cifar10": _CIFAR10.split(), "cifar100": _CIFAR100.split()}


class CIFARDataModule(ImageDataModule):
    """CIFAR-10 or CIFAR-100 from torchvision, with a seeded train/validation split.

    The 50,000 training images are split into `50,000 - val_size` for training and `val_size` for
    validation (the same split in every run); test is the official 10,000-image test set. Images stay in
    memory as one (N, 3, 32, 32) uint8 tensor and batches are gathered by indexing; augmentation
    (random crop with 4-pixel padding and flips by default) runs batched on the device.

    Args:
        name: `cifar10` or `cifar100`.
        data_dir: Where the dataset is (or is downloaded to).
        download: Download the dataset if it is not in `data_dir` (only in `prepare_data`, on one process).
        val_size: Training images held out for validation.
        split: Which of the 50,000 training images validate instead (a `ValidationSplit`, seeded by `seed`; its
            statistics then come from the part that trains). Default: `val_size` images drawn by `seed`.
        **kwargs: The loader and augmentation settings of `ImageDataModule` (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        name: Literal["cifar10", "cifar100"] = "cifar10",
        data_dir: str = "data",
        download: bool = True,
        val_size: int = 5000,
        split: ValidationSplit | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.split = split
        if not 0 < val_size < _TRAIN_SIZE:
            raise UserError(
                f"data.val_size must be between 1 and {_TRAIN_SIZE - 1} for {name}, got {val_size}"
            )
        self.name = name
        self.data_dir = Path(data_dir)
        self.download = download
        self.val_size = val_size
        self.dataset_cls, self.archive, self.mean, self.std = _DATASETS[name]
        self._classes: list[str] = list(_CLASSES[name])

    @property
    def class_names(self) -> list[str]:
        return self._classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, 32, 32)

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the only place that downloads.
        if not self.download:
            return
        created = [p for p in (self.data_dir, *self.data_dir.parents) if not p.exists()]
        archive = self.data_dir / self.archive
        had_archive = archive.exists()
        for train in (True, False):
            try:
                self.dataset_cls(self.data_dir, train=train, download=True)
            except Exception as e:  # URLError, timeouts, checksum failures
                # Leave nothing behind: no half-downloaded archive, no empty data folder.
                if not had_archive:
                    archive.unlink(missing_ok=True)
                for folder in created:
                    with contextlib.suppress(OSError):
                        folder.rmdir()  # only if empty
                raise UserError(self._missing_message(f"download failed ({type(e).__name__}: {e})")) from None

    def labelled_splits(self) -> LabelledSplits:
        """The images (as (32, 32, 3) uint8 arrays, views of the loaded tensors) and labels of train, val and
        test, downloaded first where data.download allows it."""
        self.prepare_data()
        self.setup("fit")
        self.setup("test")
        splits: dict[str, tuple[list[Any], list[Any]]] = {}
        for split, dataset in (("train", self.train_set), ("val", self.val_set), ("test", self.test_set)):
            # what setup builds: the loaded tensors, labelled
            assert isinstance(dataset, TensorImageDataset) and isinstance(dataset.images, torch.Tensor)
            assert dataset.targets is not None
            rows = dataset.indices.tolist()
            images = dataset.images.permute(0, 2, 3, 1).numpy()  # (N, 32, 32, 3): views, no copy
            splits[split] = ([images[i] for i in rows], dataset.targets[rows].tolist())
        return LabelledSplits(
            self.class_names, self.targets, splits, MAX_IMAGE_PIXELS, 32, self.seed, type(self).__name__
        )

    def _load(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            ds = self.dataset_cls(self.data_dir, train=train, download=False)
        except (
            RuntimeError,
            OSError,
        ) as e:  # torchvision's "not found or corrupted", or a missing batch file
            raise UserError(self._missing_message(str(e))) from None
        images = (
            torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        )  # (N, 32, 32, 3) -> (N, 3, 32, 32)
        return images, torch.tensor(ds.targets, dtype=torch.long)

    def _missing_message(self, reason: str) -> str:
        return (
            f"{self.name} is not in {self.data_dir.resolve()} and could not be loaded: {reason}. "
            f"Download {self.archive} from https://www.cs.toronto.edu/~kriz/cifar.html and put it in "
            f"{self.data_dir.resolve()} (it is extracted on the next run), or set data.data_dir to where it is. "
            "Offline: train on the images shipped in samples/ (--config configs/sample.yaml) or on your own "
            "class folders (--config configs/folder.yaml --data.root path/to/images)."
        )

    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate") and self.val_set is None:
            images, targets = self._load(train=True)
            if self.val_size >= len(images):
                raise UserError(
                    f"data.val_size={self.val_size} is not smaller than the {len(images)} training images"
                )
            perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.seed))
            val_idx, train_idx = perm[: self.val_size], perm[self.val_size :]
            if self.split is not None:  # and the statistics of the part that trains, not of all 50,000
                parts = self.split.split(targets.tolist(), self.seed, self.targets)
                train_idx, val_idx = map(torch.tensor, parts)
                if not self._given_stats:  # (a pretrained network's own stats stay)
                    self.mean, self.std = channel_mean_std(images[train_idx].split(4096))
            sample_transform = self.augment.sample_transform()
            self.train_set = TensorImageDataset(images, targets, train_idx, sample_transform=sample_transform)
            self.val_set = TensorImageDataset(images, targets, val_idx)
        if stage in ("test", "predict") and self.test_set is None:
            images, targets = self._load(train=False)
            self.test_set = TensorImageDataset(images, targets)
            self.predict_set = TensorImageDataset(images)  # yields indices instead of labels
            self.predict_names = [f"{self.name}/test/{i}" for i in range(len(images))]
