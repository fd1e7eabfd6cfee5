"""`StreamingImageDataModule`: images streamed from litdata chunks (`python -m project prepare`), in a local
folder or object storage (s3://, gs://, ...), for datasets beyond one disk and runs over many nodes.

litdata is an optional extra, imported only when the DataModule reads a dataset (never by importing this
module): a fit with another DataModule does not load it.
"""

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from project.data.datamodule import ImageDataModule
from project.data.image_reading import MAX_IMAGE_PIXELS, decode_image
from project.data.samplers import run_seed
from project.data.splits import ValidationSplit
from project.data.targets import TargetKind, kind_named
from project.errors import UserError, warn
from project.streaming.metadata import METADATA, read_metadata

#: Lightning's notices about a litdata loader that do not hold for this DataModule's: litdata gives every loader
#: worker its own chunks (so the dataset's `__len__` holds with many workers), and predictions are named by the
#: index each sample carries, not by the batch indices Lightning cannot infer. Left out once it sets up.
LOADER_NOTICES = (
    r"Your `IterableDataset` has `__len__` defined",
    r"Couldn't infer the batch indices fetched from your dataloader",
)


class DecodeSample:
    """litdata's per-sample transform, run in the loader workers: the stored JPEG decoded, its shorter side
    resized to `size` and centre-cropped, as a uint8 (3, size, size) tensor with its target (int64 class, or
    float32 row: multi-hot tags, or values), or with its index in the split when `index` (prediction)."""

    def __init__(
        self, size: int, index: bool = False, names: int | None = None, noun: str = "class", split: str = ""
    ) -> None:
        self.size, self.index = size, index
        # What the metadata says each target must fit (a target outside it stops in one line naming the image,
        # not with an IndexError in the loss): `names` classes, or rows of `names` tags or values.
        self.names, self.noun, self.split = names, noun, split

    def __call__(self, item: dict[str, Any]) -> tuple[Tensor, Any]:
        image = decode_image(io.BytesIO(item["image"]), self.size, MAX_IMAGE_PIXELS)
        x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).contiguous()
        if self.index:
            return x, int(item["index"])
        target = item["target"]
        if isinstance(target, np.ndarray | Tensor):
            row = torch.as_tensor(np.asarray(target), dtype=torch.float32)
            if self.names is not None and row.numel() != self.names:
                raise self._misfit(item, f"a target row of {row.numel()}")
            return x, row
        if self.names is not None and not 0 <= int(target) < self.names:
            raise self._misfit(item, f"{self.noun} number {int(target)}")
        return x, int(target)

    def _misfit(self, item: dict[str, Any], held: str) -> UserError:
        nouns = f"{self.noun}es" if self.noun.endswith("s") else f"{self.noun}s"
        return UserError(
            f"{self.split}: image {int(item['index'])} holds {held}, but {METADATA} names {self.names} {nouns}: "
            "it was edited, or belongs to another dataset; prepare the images again"
        )


_LOADER_CLASS: list[type] = []


def resumable_loader_class() -> type:
    """litdata's `StreamingDataLoader`, continuing correctly into the epoch after a resumed one.

    Lightning saves the loader's `state_dict` in every checkpoint and restores it on `--ckpt_path last` (the
    fit loop's `combined_loader` entry): the resumed epoch continues where the run stopped. But the loader
    clears its "restored" flag only when an epoch's iteration runs to its end, and Lightning stops asking for
    batches once it has the epoch's `len(loader)`: the flag stays set, the next epoch starts from the restored
    position again, finds it at the end of the epoch and yields nothing. Here the flag is dropped when a new
    iteration begins after the restored one has been started.
    """
    if not _LOADER_CLASS:
        from litdata import StreamingDataLoader

        class ResumableStreamingDataLoader(StreamingDataLoader):
            _restored_epoch_started = False

            def __iter__(self) -> Any:
                if self.restore and self._restored_epoch_started:
                    self.restore = False
                self._restored_epoch_started = self.restore
                return super().__iter__()

        _LOADER_CLASS.append(ResumableStreamingDataLoader)
    return _LOADER_CLASS[0]


class StreamingImageDataModule(ImageDataModule):
    """Images streamed from a dataset prepared by `python -m project prepare`: class names, the kind of
    target, the splits and the training images' mean and std come from its metadata.

    The loader workers read litdata's chunks (downloading them to `cache_dir` first when `input_dir` is a
    URL), decode each JPEG, resize its shorter side to `image_size` and centre-crop it; batches leave the
    loader as `(uint8 images (B, 3, H, W), targets)` like every DataModule's, and the on-device augmentation
    (random crop with padding, flips, Cutout, MixUp/CutMix) follows. Every process and every worker reads its
    own share of the chunks (litdata's sharding, from the distributed environment). The training order is
    shuffled per epoch from the run's seed; the loader's position in the epoch is saved in every checkpoint
    and restored on `--ckpt_path last`, so a run stopped in the middle of an epoch continues with the rest
    of it.

    Args:
        input_dir: The prepared dataset: a local folder, or a URL litdata reads (s3://bucket/prefix, gs://...,
            azure://...); credentials come from the usual environment (AWS_* variables, ~/.aws, ...).
        image_size: Side of the square images the network sees.
        decode_size: Side of the squares the loader workers decode, when larger than `image_size`: each batch
            is then resized to `image_size` on the device, or cut from it by the random-resized crop
            (`crop_scale`), as `cache_size` does for image folders. Default: `image_size`.
        cache_dir: Where chunks downloaded from a URL are kept; default: litdata's own cache folder.
        max_cache_size: Most disk the downloaded chunks may take (e.g. "50GB"); older chunks are evicted.
        predict_split: The split `predict` reads (`test`, `val` or `train`); default: test, else val.
        split: Which rows of the stored training split validate, from the parts `prepare --num_folds` recorded
            (cross-validation's folds). Default: the stored validation split.
        **kwargs: The loader and augmentation settings of `ImageDataModule` (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        input_dir: str,
        image_size: int = 64,
        decode_size: int | None = None,
        cache_dir: str | None = None,
        max_cache_size: str = "100GB",
        predict_split: str | None = None,
        split: ValidationSplit | None = None,
        **kwargs: Any,
    ) -> None:
        if image_size < 1:
            raise UserError(f"data.image_size must be at least 1, got {image_size}")
        if decode_size is not None and decode_size < image_size:
            raise UserError(f"data.decode_size must be at least image_size={image_size}, got {decode_size}")
        super().__init__(**kwargs)
        self.split = split
        self.input_dir = input_dir if "://" in input_dir else str(Path(input_dir).expanduser())
        self.image_size = image_size
        self.source_size: int = decode_size or image_size
        self.cache_dir = cache_dir
        self.max_cache_size = max_cache_size
        self._meta: dict[str, Any] | None = None
        self._predict_split = predict_split

    @property
    def meta(self) -> dict[str, Any]:
        """The prepared dataset's metadata (`streaming.json`), read and checked against the settings once, when
        something first asks for it (the data -> model links do, for the class names)."""
        if self._meta is None:
            meta = read_metadata(self.input_dir)
            splits = meta["splits"]
            if self._predict_split is not None and self._predict_split not in splits:
                raise UserError(
                    f"data.predict_split {self._predict_split!r} is not a split of {self.input_dir} "
                    f"({', '.join(splits)})"
                )
            if (
                self.split is not None
            ):  # refused now, before anything is built, if it cannot divide what is stored
                self.split.stored_rows((meta.get("folds") or {}).get("sizes"), self.input_dir)
            if not self._given_stats:  # (a pretrained network's own stats stay)
                self.mean, self.std = tuple(meta["mean"]), tuple(meta["std"])
            self._meta = meta
        return self._meta

    @property
    def predict_split(self) -> str:
        """The split `predict` reads: `predict_split`, else test, else val."""
        return self._predict_split or ("test" if "test" in self.meta["splits"] else "val")

    @property
    def class_names(self) -> list[str]:
        return list(self.meta["classes"])

    @property
    def targets(self) -> TargetKind:
        # Datasets prepared before the kind was recorded say only whether they are multi-label.
        kind = self.meta.get("targets") or ("tags" if self.meta.get("multilabel") else "classes")
        return kind_named(kind, self.class_names)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    def _split_dir(self, split: str) -> str:
        return f"{self.input_dir.rstrip('/')}/{split}"

    def _dataset(self, split: str, train: bool = False, index: bool = False) -> Any:
        from litdata import StreamingDataset

        kwargs: dict[str, Any] = {}
        if self.cache_dir is not None:
            from litdata.streaming.resolver import Dir

            # One folder per split: their chunks have the same names.
            kwargs["input_dir"] = Dir(path=str(Path(self.cache_dir) / split), url=self._split_dir(split))
        else:
            kwargs["input_dir"] = self._split_dir(split)
        return StreamingDataset(
            shuffle=train,
            drop_last=train,
            seed=run_seed(),
            max_cache_size=self.max_cache_size,
            transform=DecodeSample(
                self.source_size, index, len(self.class_names), self.targets.noun, self._split_dir(split)
            ),
            **kwargs,
        )

    def has_test_split(self) -> bool:
        return "test" in self.meta["splits"]

    def setup(self, stage: str) -> None:
        # Made here, after the processes have joined: litdata reads the distributed environment when a dataset is
        # created, to give each process its own chunks.
        if stage == "fit" and (self.augment.flip == "alternate" or self.augment.trivial_augment):
            key = "flip alternate" if self.augment.flip == "alternate" else "trivial_augment true"
            raise UserError(
                f"data.augment.{key} needs the images in memory (CIFAR, or image files with data.cache true), "
                "not streamed from chunks"
            )
        for notice in LOADER_NOTICES:
            warnings.filterwarnings("ignore", message=notice)
        self._check_every_process_gets_a_batch(stage)
        if self.train_set is None and self.split is None:
            self.train_set = self._dataset("train", train=True)
            self.val_set = self._dataset("val")
        elif (
            self.train_set is None
        ):  # the split's rows of the stored training split validate, the others train
            assert self.split is not None
            train_rows, val_rows = self.split.stored_rows(self.meta["folds"]["sizes"], self.input_dir)
            self.train_set = self._dataset("train", train=True).subset(train_rows)
            self.val_set = self._dataset("train").subset(val_rows)
        if stage == "test" and self.test_set is None:
            if "test" in self.meta["splits"]:
                self.test_set = self._dataset("test")
            else:
                warn(
                    "the dataset has no test split: testing on the validation split, which chose the best "
                    "checkpoint; for a held-out score prepare it from data with a test split"
                )
                self.test_set, self.tested_split = self._dataset("val"), "validation"
        if stage == "predict" and self.predict_set is None:
            self.predict_set = self._dataset(self.predict_split, index=True)
            count = self.meta["splits"][self.predict_split]
            self.predict_names = [f"{self.predict_split}/{i}" for i in range(count)]
            if self._predict_split is None:
                warn(
                    f"no data.predict_split given: predicting the {self.predict_split} split of {self.input_dir} "
                    f"({count} images, named {self.predict_split}/<place in the split>); data.predict_split chooses "
                    f"one of {', '.join(self.meta['splits'])}"
                )

    def _check_every_process_gets_a_batch(self, stage: str) -> None:
        """litdata deals whole batches to the processes and the leftover items to the last one: a split of fewer
        than processes x batch_size images leaves a process without any, which Lightning stops with a traceback."""
        processes = self._world()[0]
        splits = {"fit": ["train", "val"], "validate": ["val"], "test": ["test" if "test" in self.meta["splits"]
                  else "val"], "predict": [self.predict_split]}.get(stage, [])  # fmt: skip
        for split in splits if processes > 1 and self.split is None else []:
            count = self.meta["splits"][split]
            if count < processes * self.batch_size:
                raise UserError(
                    f"the {split} split of {self.input_dir} has {count} images, fewer than {processes} processes x "
                    f"data.batch_size {self.batch_size}: some process would get none; lower data.batch_size to "
                    f"{max(1, count // processes)} or below, or run on fewer processes"
                )

    def iterable_loader(self, dataset: IterableDataset, **settings: Any) -> DataLoader:
        return resumable_loader_class()(dataset, **settings)


__all__ = ["METADATA", "StreamingImageDataModule", "read_metadata"]
