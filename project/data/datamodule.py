"""`ImageDataModule`: loader settings and the on-device augmentation (`data.augment`) of every image DataModule."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset

from project.data.augment import BatchAugmentation, normalize
from project.data.samplers import ResumableLoader, ResumableSampler, ShardSampler, run_seed
from project.data.targets import Classes, TargetKind
from project.data.tensor_dataset import TensorImageDataset, collate_pre_batched
from project.errors import UserError
from project.machine import available_cpus


def per_device_batch_size(
    batch_size: int, global_batch_size: int | None, world_size: int, accumulate_grad_batches: int
) -> int:
    """Samples per batch on each device: `global_batch_size` split over processes and accumulated batches when
    it is set, else `batch_size`. A global size that does not split evenly is an error."""
    if global_batch_size is None:
        return batch_size
    parts = world_size * accumulate_grad_batches
    if global_batch_size % parts:
        raise UserError(
            f"data.global_batch_size={global_batch_size} does not divide into {world_size} process(es) x "
            f"{accumulate_grad_batches} accumulated batch(es) = {parts} equal per-device batches; choose a "
            f"multiple of {parts}, or set the per-device data.batch_size instead"
        )
    return global_batch_size // parts


@dataclass
class LabelledSplits:
    """A source's samples split by split, as a tool that stores them elsewhere (in chunks, in another format)
    reads them: `splits` maps each split (train, val, and test where the data has one) to its items and labels.
    An item is an image file's path or an (H, W, 3) uint8 array already in memory; a label is what `targets`
    reads (a class index, a list of tags, a list of values)."""

    classes: list[str]
    targets: TargetKind
    splits: dict[str, tuple[list[Any], list[Any]]]
    #: The largest width x height decoded, and the side the network sees.
    max_pixels: int
    image_size: int
    #: The seed of the source's own splits, which folds dealt from the training split reuse.
    seed: int
    #: What the data came from (the DataModule's class name), for a copy to record.
    name: str


class ImageDataModule(L.LightningDataModule):
    """Base class: subclasses fill `train_set`, `val_set`, `test_set`, `predict_set` in `setup`.

    Batches leave the DataLoader as `(uint8 images (B, C, H, W), targets)`, the targets of the data's kind
    (`targets`, `project.data.targets`): int64 labels (B,), float32 multi-hot rows (B, tags) for multi-label data,
    float32 values (B, values) for regression. After they reach the
    device, `on_after_batch_transfer` augments training batches (`augment`, a `BatchAugmentation`: crop, flip and
    the optional regularisers, independent per image; a mixed batch gains soft targets) and brings every batch to the
    network's input size and normalises it, on the GPU when there is one. Prediction batches carry each
    sample's index instead of a label.

    The training order is a permutation per epoch drawn from the run's seed and the epoch, dealt to the
    processes by the loader itself, and its position is saved in every checkpoint: a run stopped in the
    middle of an epoch continues with exactly the batches it would have drawn (see `project.data.samplers`).
    Validation, test and prediction give each process its own whole batches, every sample exactly once
    (with DDP; a sharded model needs the same number of batches on every process, which Lightning's sampler
    pads with repeated samples).

    Args:
        batch_size: Samples per batch, per device (ignored when `global_batch_size` is set). Reading
            `batch_size` gives the per-device size the run uses, derived from `global_batch_size` if set.
        global_batch_size: Samples per optimizer step over all devices, nodes and accumulated batches. When
            set, the per-device batch size is derived from it: global / (devices x nodes x
            accumulate_grad_batches), so the same recipe optimises identically on 1 GPU or 64. A size that
            does not divide is an error.
        prepare_data_per_node: Download (prepare_data) on the first process of every node, for nodes that
            do not share a filesystem. Default: only on global rank 0, while the others wait (a shared
            filesystem, the usual cluster setup: concurrent downloads into one folder would corrupt it).
        num_workers: DataLoader worker processes. Default: 0 when batches are gathered from an in-memory
            tensor (nothing to parallelise), else one per available CPU (at most 8).
        pin_memory: Page-locked host memory for faster host-to-GPU copies. Default: only with CUDA.
        persistent_workers: Keep workers alive between epochs (saves their start-up every epoch).
        prefetch_factor: Batches each worker loads ahead.
        seed: Seed of the train/validation split (fixed, so the split is the same in every run).
        on_device: Move in-memory datasets (CIFAR, cached folders) to the training device once, so batches are
            gathered there and an epoch never touches the host (the fastest CIFAR trainers do this). Needs the
            dataset to fit in device memory (CIFAR-10 train: 150 MB as uint8).
        augment: The training augmentation and the evaluation view (crop, flip, Cutout, MixUp/CutMix, ...;
            `BatchAugmentation`), as `--data.augment.KEY VALUE`.
    """

    #: Per-channel mean and std in [0, 1] units; set by subclasses.
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    #: Whether mean/std were given (by the config or a pretrained network) rather than measured on the data.
    _given_stats: bool = False
    #: Side of the squares images are decoded to before the device brings them to the input (a larger one
    #: leaves room for random-resized crops); None: the input's own.
    source_size: int | None = None
    #: The split `test_dataloader` serves, as reports name it: `validation` where the data has no test split.
    tested_split: str = "test"

    def __init__(
        self,
        batch_size: int = 128,
        global_batch_size: int | None = None,
        prepare_data_per_node: bool = False,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        seed: int = 0,
        on_device: bool = False,
        augment: BatchAugmentation = BatchAugmentation(),  # noqa: B008  # frozen: one shared default is safe
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise UserError(f"data.batch_size must be at least 1, got {batch_size}")
        if num_workers is not None and num_workers < 0:
            raise UserError(f"data.num_workers must be >= 0, got {num_workers}")
        if global_batch_size is not None and global_batch_size < 1:
            raise UserError(f"data.global_batch_size must be at least 1, got {global_batch_size}")
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.prepare_data_per_node = prepare_data_per_node
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.seed = seed
        self.on_device = on_device
        self.augment = augment
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None
        #: One display name per prediction input (file path or split index), set in setup("predict").
        self.predict_names: list[str] = []
        self._norm_cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    # -- what the model needs to know (linked by the CLI at instantiation) ---------------------------------
    @property
    def class_names(self) -> list[str]:
        """The name of each output of the model, in order: the classes of single-label data (target i is the
        class `class_names[i]`), the tags of multi-label data (column i of a target is tag `class_names[i]`), or
        the names of the values of regression data. Every DataModule provides it."""
        raise NotImplementedError

    @property
    def targets(self) -> TargetKind:
        """The kind of the targets (one class per image by default), over `class_names`."""
        return Classes(tuple(self.class_names))

    @property
    def num_classes(self) -> int:
        """The number of network outputs the targets imply (one per class, tag or value)."""
        return self.targets.outputs

    @property
    def input_shape(self) -> tuple[int, int, int]:
        raise NotImplementedError

    # -- loaders --------------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """The per-device batch size of this run: derived from `global_batch_size` when that is set (an error
        when it does not divide), else the configured one."""
        world_size, accumulate = self._world()[0], self._accumulation()
        return per_device_batch_size(self._batch_size, self.global_batch_size, world_size, accumulate)

    @batch_size.setter
    def batch_size(self, value: int) -> None:  # the configured size (the batch-size finder sets it too)
        self._batch_size = value

    def _world(self) -> tuple[int, int]:
        """(processes, this process's global rank); (1, 0) outside a Trainer."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _accumulation(self) -> int:
        return self.trainer.accumulate_grad_batches if self.trainer is not None else 1

    def _uneven_shards_ok(self, samples: int, batch_size: int) -> bool:
        """Whether the processes may evaluate different numbers of batches. Not with a sharded model (FSDP,
        ModelParallelStrategy, DeepSpeed), whose every forward pass is a collective of all processes, nor when
        a process would get no batch at all (DDP's first forward pass in evaluation broadcasts buffers)."""
        world_size = self._world()[0]
        if world_size == 1 or self.trainer is None:
            return True
        strategy = self.trainer.strategy
        replicated = isinstance(strategy, DDPStrategy) and not isinstance(strategy, DeepSpeedStrategy)
        return replicated and -(-samples // batch_size) >= world_size

    def _loader(self, dataset: Dataset | None, split: str, train: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: the {split} split is not set up; call setup() first")
        batch_size = self.batch_size
        world_size, rank = self._world()
        in_memory = isinstance(dataset, TensorImageDataset) and dataset.sample_transform is None
        if in_memory and self.on_device and self.trainer is not None:
            assert isinstance(dataset, TensorImageDataset)  # in_memory says so
            dataset.to(self.trainer.strategy.root_device)
        workers = self.num_workers
        if workers is None:
            workers = 0 if in_memory else min(8, available_cpus())
        batched = isinstance(dataset, TensorImageDataset)
        settings: dict[str, Any] = dict(
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=collate_pre_batched if batched else None,
            pin_memory=self.pin_memory and not (in_memory and self.on_device),
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            # Workers' seeds come from here, not from a draw of the global generator, whose sequence of draws
            # (augmentation, dropout) must not depend on when loaders are created (a resume creates them anew).
            generator=torch.Generator().manual_seed(run_seed()),
        )
        if isinstance(dataset, IterableDataset):
            # A dataset that deals its own samples to the processes and workers (a stream): no sampler,
            # and the loader `iterable_loader` makes keeps its place in the epoch for a checkpoint.
            return self.iterable_loader(dataset, drop_last=train, **settings)
        if not train:
            if not self._uneven_shards_ok(len(dataset), batch_size):  # pyright: ignore[reportArgumentType]
                return DataLoader(dataset, **settings)  # Lightning shards it, padding with repeated samples
            # Each process evaluates its own whole batches, no sample twice: metrics over all processes are
            # those of one process.
            sampler = ShardSampler(dataset, batch_size, world_size, rank)
            return DataLoader(dataset, sampler=sampler, **settings)
        if self.trainer is not None and getattr(
            self.trainer, "overfit_batches", 0
        ):  # set by its loop connector
            # A debug run on the same few batches: Lightning rebuilds its loader in a fixed order.
            return DataLoader(dataset, shuffle=False, **settings)
        # Full batches only (stable BatchNorm statistics, no recompiles), unless the split is smaller.
        drop_last = len(dataset) >= batch_size * world_size  # pyright: ignore[reportArgumentType]
        sampler = ResumableSampler(dataset, world_size, rank, shuffle=True, seed=run_seed())
        return ResumableLoader(dataset, sampler, drop_last=drop_last, **settings)

    def iterable_loader(self, dataset: IterableDataset, **settings: Any) -> DataLoader:
        """The loader of a dataset that deals its own samples: a plain `DataLoader`, unless the dataset needs
        its own kind to save and restore its position (a DataModule of such datasets overrides this)."""
        return DataLoader(dataset, **settings)

    def train_dataloader(self) -> DataLoader:
        if (
            self.augment.flip == "alternate"
        ):  # each image's row rides along with it, for its flip to follow it
            if not isinstance(self.train_set, TensorImageDataset):
                raise UserError(
                    "data.augment.flip alternate needs the images in memory: CIFAR, or data.cache true"
                )
            self.train_set.return_rows = True
        if isinstance(self.train_set, TensorImageDataset):
            self.train_set.seed = run_seed()  # per-image random transforms follow the run's seed
        return self._loader(self.train_set, "train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_set, "predict")

    # -- on-device augmentation and normalisation -----------------------------------------------------------
    def transform_batch(self, batch: tuple[Tensor, ...], train: bool, epoch: int = 0) -> tuple[Tensor, ...]:
        """Augment (if `train`) and normalise a uint8 batch on whatever device it is on. A batch may carry each
        image's dataset row third (for alternating flips); the result is `(images, targets)`, or for a mixed
        training batch `(images, soft targets, targets)`."""
        x, y, *rows = batch
        x = self.augment.images(x, rows[0] if rows else None, train, epoch, self._input_size(x), self.seed)
        key = (x.device, tuple(self.mean), tuple(self.std))
        if key not in self._norm_cache:  # two tiny host-to-device copies: once, not per batch
            self._norm_cache[key] = (
                torch.tensor(key[1], device=x.device),
                torch.tensor(key[2], device=x.device),
            )
        x = normalize(x, *self._norm_cache[key])
        return self.augment.normalized(x, y, train, self.targets)

    def _input_size(self, x: Tensor) -> tuple[int, int]:
        """The network's input (height, width): the batch's own when the DataModule does not say."""
        try:
            return tuple(self.input_shape[1:])  # pyright: ignore[reportReturnType]
        except NotImplementedError:
            return (x.shape[-2], x.shape[-1])

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # The model summary's example_input_array comes as one float tensor, ready for the network.
        if not isinstance(batch, tuple | list):
            return batch
        trainer = self.trainer
        training = trainer is not None and trainer.training
        epoch = trainer.current_epoch if trainer is not None and training else 0
        return self.transform_batch(tuple(batch), train=training, epoch=epoch)

    def labelled_splits(self) -> LabelledSplits:
        """The data's samples as items and labels per split, for a tool that stores them elsewhere: train and
        val (the data's own, or the seeded validation split the DataModule draws) and test where there is one.
        A source whose samples can be listed so overrides this."""
        raise UserError(
            f"{type(self).__name__} does not list its samples: give it a labelled_splits() method (the items and "
            "labels of each split), as the class-folder, CSV and CIFAR DataModules have"
        )

    def has_test_split(self) -> bool:
        """Whether the data holds images kept apart for testing: `fit` tests its best checkpoint on them."""
        return True

    def use_network_stats(self, stats: tuple[Sequence[float], Sequence[float]] | None) -> None:
        """Normalise with the per-channel mean and std a pretrained network's weights were trained with (its
        `input_stats()`; None: the network has none), unless the config set `data.mean`/`data.std`."""
        if stats is not None and not self._given_stats:
            self.mean, self.std = tuple(stats[0]), tuple(stats[1])
            self._given_stats = True

    def state_dict(self) -> dict[str, Any]:
        # Stored in checkpoints: evaluating, predicting, exporting or serving from one prepares images exactly
        # as training's evaluation did (decoded squares of source_size, the central eval_crop, normalised).
        return {
            "mean": list(self.mean),
            "std": list(self.std),
            "class_names": list(self.class_names),
            "targets": self.targets.kind,
            "source_size": self.source_size or self.input_shape[1],
            "eval_crop": self.augment.eval_crop,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "mean" in state_dict:
            self.mean, self.std = tuple(state_dict["mean"]), tuple(state_dict["std"])
