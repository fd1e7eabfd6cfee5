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
    """Samples per batch and device: `global_batch_size` split over processes and accumulated batches, else
    `batch_size`; a global size that does not split evenly is an error."""
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
    """A source's samples as a tool that stores them elsewhere reads them: each split (train, val, test where
    there is one) -> its items (image paths, or (H, W, 3) uint8 arrays) and labels (as `targets` reads them)."""

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

    Batches leave the loader as `(uint8 images (B, C, H, W), targets)` of the data's kind (`targets`), prediction
    batches with each sample's index instead. On the device, `on_after_batch_transfer` augments training batches
    (`augment`) and brings every batch to the network's input, normalised.

    The training order is a permutation per epoch from the run's seed, dealt to the processes by the loader and
    saved in checkpoints: a run stopped mid-epoch continues with the batches it would have drawn
    (`project.data.samplers`). Evaluation gives each process whole batches, every sample once (a sharded model
    needs equal batch counts: Lightning's sampler pads those).

    Args:
        batch_size: Samples per batch and device (derived from `global_batch_size` when that is set).
        global_batch_size: Samples per optimizer step over all devices, nodes and accumulated batches: the
            per-device size becomes global / (devices x nodes x accumulate_grad_batches), so a recipe optimises
            alike on 1 GPU or 64 (a size that does not divide is an error).
        prepare_data_per_node: Download on the first process of every node (nodes without a shared filesystem);
            default: on global rank 0 only, the others waiting (concurrent downloads would corrupt the folder).
        num_workers: Loader worker processes. Default: 0 for in-memory tensors, else one per CPU (at most 8).
        pin_memory: Page-locked host memory for faster host-to-GPU copies. Default: only with CUDA.
        persistent_workers: Keep workers alive between epochs.
        prefetch_factor: Batches each worker loads ahead.
        seed: Seed of the train/validation split (the same split in every run).
        on_device: Move in-memory datasets (CIFAR, cached folders) to the device once, so an epoch never touches
            the host (CIFAR-10 train: 150 MB as uint8).
        augment: The training augmentation and the evaluation view (`BatchAugmentation`), as
            `--data.augment.KEY VALUE`.
    """

    #: Per-channel mean and std in [0, 1] units; set by subclasses.
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    #: Whether mean/std were given (by the config or a pretrained network) rather than measured on the data.
    _given_stats: bool = False
    #: Side of the squares decoded before the device brings them to the input (larger: room for random crops).
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
        """The name of each output of the model, in order (classes, tags, values: the kind's names)."""
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
        """The per-device batch size of this run (from `global_batch_size` when that is set)."""
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
        """Whether processes may evaluate different numbers of batches: not under a sharded model (each forward is
        a collective), nor when a process would get none (DDP's first evaluation forward broadcasts buffers)."""
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
        """The loader of a dataset that deals its own samples (a DataModule whose stream saves its place
        overrides it)."""
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
        """Augment (if `train`) and normalise a uint8 batch (a third item: the images' rows, for alternating
        flips): `(images, targets)`, or mixed `(images, soft targets, targets)`."""
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
        """The data's samples per split (`LabelledSplits`), for a tool that stores them elsewhere; a DataModule
        that can list them overrides this."""
        raise UserError(
            f"{type(self).__name__} does not list its samples: give it a labelled_splits() method (the items and "
            "labels of each split), as the class-folder, CSV and CIFAR DataModules have"
        )

    def has_test_split(self) -> bool:
        """Whether the data holds images kept apart for testing: `fit` tests its best checkpoint on them."""
        return True

    def use_network_stats(self, stats: tuple[Sequence[float], Sequence[float]] | None) -> None:
        """Normalise with a pretrained network's `input_stats()` (None: it has none), unless the config set
        `data.mean`/`data.std`."""
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
