"""Samplers that shard over processes themselves: a resumable training order and unpadded evaluation shards.

Both subclass `DistributedSampler`, so Lightning keeps them as they are whatever `use_distributed_sampler`
says (it injects its own sampler only into loaders whose sampler is not a `DistributedSampler`), and calls
`set_epoch` on them at every epoch start as it would on its own. Lightning's `DistributedSampler` stays in
place for loaders the template does not build.
"""

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def run_seed() -> int:
    """The run's seed: what `seed_everything` recorded in `PL_GLOBAL_SEED` (the same in every process), else 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class ResumableSampler(DistributedSampler):
    """The training order: a fresh permutation per epoch from `seed + epoch` (DistributedSampler's order, padded
    or cut to a multiple of the number of processes), dealt round-robin to the processes, and resumable in
    the middle of an epoch.

    The order is a function of (seed, epoch) only, never of the global random generator, so a resumed run
    draws the same batches and the generator keeps the same sequence of draws for augmentation. `skip(n)`
    makes the next iteration leave out the first `n` samples of the epoch's order (counted over all
    processes), the ones the run consumed before it stopped.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last)
        self._skip = 0

    def order(self) -> list[int]:
        """This epoch's indices over all processes, `total_size` long."""
        n = len(self.dataset)  # pyright: ignore[reportArgumentType]  # a map-style dataset has a length
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=generator).tolist()
        else:
            indices = list(range(n))
        if self.drop_last:
            return indices[: self.total_size]
        padding = self.total_size - len(indices)
        return indices + (indices * (padding // max(1, n) + 1))[:padding]

    def skip(self, samples: int) -> None:
        """Leave out the first `samples` of this epoch's order in the next iteration (once)."""
        self._skip = samples

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # a new epoch starts from its beginning; the same one keeps a pending skip
            self._skip = 0
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        start, self._skip = self._skip, 0
        return iter(self.order()[start + self.rank : self.total_size : self.num_replicas])


class ResumableLoader(DataLoader):
    """A DataLoader over a `ResumableSampler` that can stop and continue in the middle of an epoch.

    Lightning saves `state_dict()` in every checkpoint (the fit loop's `combined_loader` entry) and hands it
    to `load_state_dict` when training resumes, before the first batch is drawn. The state is the epoch and
    the number of samples of its order the training consumed: counted where batches leave the loader for the
    training step, not in the sampler, which worker processes read ahead of the training.
    """

    sampler: ResumableSampler

    def __init__(self, dataset: Dataset, sampler: ResumableSampler, **kwargs: Any) -> None:
        super().__init__(dataset, sampler=sampler, **kwargs)
        self._epoch = -1  # the epoch being iterated, and how many of its batches this process handed out
        self._batches = 0

    @property
    def _step(self) -> int:
        """Samples of the epoch's order that one batch of every process covers."""
        return (self.batch_size or 1) * self.sampler.num_replicas

    def __iter__(self) -> Iterator[Any]:  # pyright: ignore[reportIncompatibleMethodOverride]  # a generator
        # Started at the first batch, not here: Lightning may create the iterator before it calls `set_epoch`
        # for the epoch (a run resumed from an end-of-epoch checkpoint), and worker processes would read the
        # sampler at once, in the previous epoch's order.
        self._epoch, self._batches = self.sampler.epoch, self.sampler._skip // self._step
        for batch in super().__iter__():
            self._batches += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        epoch, consumed = self.sampler.epoch, self.sampler._skip  # an epoch whose iteration has not started
        if self._epoch == epoch:
            consumed = self._batches * self._step
            if self._batches >= len(self):  # the epoch is over: the next one starts from its beginning
                epoch, consumed = epoch + 1, 0
        return {"epoch": epoch, "consumed": consumed, "seed": self.sampler.seed}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.sampler.seed = state_dict["seed"]
        self.sampler.set_epoch(state_dict["epoch"])
        self.sampler.skip(state_dict["consumed"])
        self._epoch = -1


class ShardSampler(DistributedSampler):
    """Evaluation order: every sample exactly once over all processes, no padding, no shuffling.

    Each process gets whole batches, dealt round-robin (batch `i` goes to process `i % num_replicas`), so
    the batches over all processes are exactly those of one process: per-batch results, and metric sums
    over them, are the ones a single process computes. Processes may get one batch more than others.
    """

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle=False)
        n = len(dataset)  # pyright: ignore[reportArgumentType]  # a map-style dataset has a length
        self.batches = [range(s, min(s + batch_size, n)) for s in range(0, n, batch_size)][rank::num_replicas]
        self.num_samples = sum(len(b) for b in self.batches)
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        return (i for batch in self.batches for i in batch)

    def __len__(self) -> int:
        return self.num_samples
