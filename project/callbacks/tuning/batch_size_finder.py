"""`MaxBatchSizeFinder`: the largest power-of-two batch size that trains without running out of memory."""

import logging
from typing import cast

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BatchSizeFinder as LightningBatchSizeFinder
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_setattr

from project.callbacks.tuning.shared import rebuild_optimizers, report, stop_after_tuning
from project.errors import UserError
from project.lightning_private import reload_dataloaders

BATCH_ARG = "batch_size"


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _floor_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1)


class MaxBatchSizeFinder(LightningBatchSizeFinder):
    """Doubles the batch size from `init_val` until training runs out of memory, before `fit` (Lightning's
    BatchSizeFinder in `power` mode, on a saved copy of the model that is restored afterwards).

    The first answer to `CUDA out of memory`: it prints the largest batch size that fits, logs it as
    `tuning/batch_size`, and the gradient accumulation that keeps the config's effective batch size
    (batch_size x accumulate_grad_batches), so the optimisation (learning rate, schedule) stays as tuned.
    The result is a power of two between `init_val` and `max_val`, and at most the training set's size; the
    message says which of memory, `max_val` and the training set's size set the limit.

    On a CPU nothing runs out of memory (the system swaps or kills the process instead), so there the
    search simply stops at `max_val` or the dataset size: the answer is meaningful on a GPU.

    Args:
        init_val: First batch size tried (a power of two).
        max_val: Largest batch size tried (a power of two).
        steps_per_trial: Training steps at each size. The first step allocates gradients and optimizer
            state; a few more catch what the allocator's fragmentation adds.
        max_trials: Most doublings tried.
        apply: False: stop after the search (a tuning-only run). True: go on training with the result.
        keep_effective_batch: With `apply`: if the configured batch size does not fit, train with the largest
            that does and raise `accumulate_grad_batches` to keep the effective batch size; if it fits, keep
            it. False: train with the largest batch size that fits, without accumulation (faster epochs,
            but retune the learning rate).
    """

    def __init__(
        self,
        init_val: int = 2,
        max_val: int = 4096,
        steps_per_trial: int = 3,
        max_trials: int = 25,
        apply: bool = False,
        keep_effective_batch: bool = True,
    ) -> None:
        if not (_is_power_of_two(init_val) and _is_power_of_two(max_val) and init_val <= max_val):
            raise UserError(
                f"MaxBatchSizeFinder: init_val and max_val must be powers of two with init_val <= max_val, "
                f"got init_val={init_val}, max_val={max_val}"
            )
        if steps_per_trial < 1 or max_trials < 1:
            raise UserError(
                f"MaxBatchSizeFinder: steps_per_trial and max_trials must be at least 1, got {steps_per_trial} "
                f"and {max_trials}"
            )
        # Lightning's power search stops once a size reaches its max_val *before* trying it: asked for one
        # doubling more, it tries max_val itself (the result is clamped below).
        super().__init__(
            mode="power",
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=BATCH_ARG,
            max_val=2 * max_val,
        )
        self.init_val, self.max_val, self.max_trials = init_val, max_val, max_trials
        self.apply = apply
        self.keep_effective_batch = keep_effective_batch

    # The search runs before fit only: validate/test/predict keep the configured batch size.
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass

    def scale_batch_size(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            rank_zero_warn(
                f"MaxBatchSizeFinder on {device.type}: nothing runs out of memory here, so the search stops at "
                f"max_val={self.max_val} or the training set's size, not at a memory limit."
            )
        configured = _batch_size(pl_module)
        try:
            with _without_lightnings_verdict():
                super().scale_batch_size(trainer, pl_module)
        except ValueError:
            # After an OOM at batch size 1, Lightning halves to 0 and the DataLoader refuses it.
            if _batch_size(pl_module) >= 1:
                raise
            raise UserError(
                f"MaxBatchSizeFinder: even a batch of 1 runs out of memory on {device}: use a smaller network or "
                "image size, mixed precision (trainer.precision bf16-mixed), or activation checkpointing "
                "(torch.utils.checkpoint) in the network."
            ) from None
        searched = self.optimal_batch_size
        if searched is None:  # fast_dev_run: Lightning skips the search (and says so)
            return
        limits = {f"max_val={self.max_val}": self.max_val}
        dataset = self._dataset_size(trainer)
        if dataset:
            limits[f"the training set's size ({dataset} images)"] = _floor_power_of_two(dataset)
        bound_name, bound = min(limits.items(), key=lambda item: item[1])
        if searched > bound:  # the search went past the bound (Lightning returns a size it did not train)
            found, why = bound, f"{bound_name} allows"
        elif searched >= self.init_val * 2 ** (self.max_trials - 1):
            found, why = searched, f"max_trials={self.max_trials} doublings"
        else:  # an out-of-memory error ended the search
            found, why = searched, "fits in memory"
        self.optimal_batch_size = found
        # Lightning leaves the last size it set (possibly one it never trained with): set the result instead.
        lightning_setattr(pl_module, BATCH_ARG, found)

        effective = configured * trainer.accumulate_grad_batches
        accumulate = -(-effective // found)  # ceil
        if found >= configured:
            advice = (
                f"the configured {configured} fits. A larger batch makes epochs faster: with "
                f"--data.init_args.batch_size {found}, scale the learning rate about linearly (x{found / configured:g})"
            )
        elif why == "fits in memory":
            advice = (
                f"the configured {configured} does not fit: train with --data.init_args.batch_size {found} "
                f"--trainer.accumulate_grad_batches {accumulate} (effective batch {found * accumulate}, "
                f"configured {effective})"
            )
        else:
            advice = f"the configured {configured} is larger, and was not tried"
        report(
            trainer,
            f"Batch-size finder: {found} is the largest size tried ({why}); {advice}",
            {"tuning/batch_size": found},
        )
        if not self.apply:
            stop_after_tuning()
        self._train_with(trainer, pl_module, configured, found, accumulate)

    def _train_with(
        self, trainer: Trainer, pl_module: LightningModule, configured: int, found: int, accumulate: int
    ) -> None:
        if self.keep_effective_batch:
            batch_size, accumulate = (
                (configured, trainer.accumulate_grad_batches) if found >= configured else (found, accumulate)
            )
        else:
            batch_size, accumulate = found, 1
        lightning_setattr(pl_module, BATCH_ARG, batch_size)
        trainer.accumulate_grad_batches = accumulate
        reload_dataloaders(trainer)
        # The number of optimizer steps changed: schedules sized from it (OneCycleLR) are rebuilt.
        rebuild_optimizers(trainer)
        report(
            trainer,
            f"Batch-size finder: training with batch size {batch_size} x {accumulate} accumulated batches",
            {"tuning/accumulate_grad_batches": accumulate},
        )

    @staticmethod
    def _dataset_size(trainer: Trainer) -> int | None:
        loader = trainer.train_dataloader
        if loader is None:
            return None
        try:
            return len(loader.dataset)
        except (AttributeError, TypeError):  # several loaders, or an iterable dataset: no bound
            return None


def _batch_size(pl_module: LightningModule) -> int:
    # lightning_getattr is typed Optional[Any]: the attribute it finds (model, hparams or datamodule) is the
    # batch size the DataLoaders were built with, an int.
    return int(cast(int, lightning_getattr(pl_module, BATCH_ARG)))


class _without_lightnings_verdict(logging.Filter):
    """Hides Lightning's closing "will continue with full run using batch size N": the size this callback
    keeps is decided after the search, and may be smaller."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "will continue with full run" not in record.getMessage()

    def __enter__(self) -> None:
        logging.getLogger("lightning.pytorch.tuner.batch_size_scaling").addFilter(self)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("lightning.pytorch.tuner.batch_size_scaling").removeFilter(self)
