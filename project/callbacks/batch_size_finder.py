"""`BatchSizeFinder`: the largest power-of-two batch size that trains without running out of memory."""

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BatchSizeFinder as LightningBatchSizeFinder
from lightning.pytorch.tuner.batch_size_scaling import _reset_dataloaders, _scale_batch_size
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_setattr

from project.callbacks._tuning import rebuild_optimizers, report, stop_after_tuning
from project.errors import UserError


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _floor_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1)


class BatchSizeFinder(LightningBatchSizeFinder):
    """Doubles the batch size from `init_val` until training runs out of memory, before `fit` (Lightning's
    BatchSizeFinder in `power` mode, on a saved copy of the model that is restored afterwards).

    The first answer to `CUDA out of memory`: it prints the largest batch size that fits, logs it as
    `tuning/batch_size`, and the gradient accumulation that keeps the config's effective batch size
    (batch_size x accumulate_grad_batches), so the optimisation (learning rate, schedule) stays as tuned.
    The result is a power of two between `init_val` and `max_val`, and at most the training set's size.

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
                f"BatchSizeFinder: init_val and max_val must be powers of two with init_val <= max_val, "
                f"got init_val={init_val}, max_val={max_val}"
            )
        if steps_per_trial < 1 or max_trials < 1:
            raise UserError(
                f"BatchSizeFinder: steps_per_trial and max_trials must be at least 1, got {steps_per_trial} "
                f"and {max_trials}"
            )
        super().__init__(
            mode="power", steps_per_trial=steps_per_trial, init_val=init_val, max_trials=max_trials
        )
        self.max_val = max_val
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
        on_cuda = trainer.strategy.root_device.type == "cuda"
        if not on_cuda:
            rank_zero_warn(
                f"BatchSizeFinder on {trainer.strategy.root_device.type}: nothing runs out of memory here, so "
                f"the search stops at max_val={self.max_val} or the training set's size, not at a memory limit."
            )
        configured = int(lightning_getattr(pl_module, self._batch_arg_name))
        # Lightning's power search stops once a size reaches its max_val *before* trying it, and may
        # return a size above the dataset's length. Asking it for one doubling more and then clamping
        # (below) makes the result a size that actually ran.
        try:
            found = _scale_batch_size(
                trainer,
                "power",
                self._steps_per_trial,
                self._init_val,
                self._max_trials,
                self._batch_arg_name,
                0.0,
                2 * self.max_val,
            )
        except ValueError:
            # After an OOM at batch size 1, Lightning halves to 0 and the DataLoader refuses it.
            if lightning_getattr(pl_module, self._batch_arg_name) >= 1:
                raise
            raise UserError(
                f"BatchSizeFinder: even a batch of 1 runs out of memory on {trainer.strategy.root_device}: use a "
                "smaller network or image size, mixed precision (trainer.precision bf16-mixed), or activation "
                "checkpointing (torch.utils.checkpoint) in the network."
            ) from None
        if found is None:  # fast_dev_run: Lightning skips the search (and says so)
            return
        bound = min(self.max_val, self._dataset_size(trainer) or self.max_val)
        found = min(found, _floor_power_of_two(bound))
        self.optimal_batch_size = found
        # Lightning leaves the last size it set (possibly the untried doubling): set the result instead.
        lightning_setattr(pl_module, self._batch_arg_name, found)

        effective = configured * trainer.accumulate_grad_batches
        accumulate = -(-effective // found)  # ceil
        limit = (
            "largest that fits"
            if on_cuda
            else f"largest tried (no memory limit on {trainer.strategy.root_device.type})"
        )
        if found < configured:
            advice = (
                f"the configured {configured} does not fit: train with --data.init_args.batch_size {found} "
                f"--trainer.accumulate_grad_batches {accumulate} (effective batch {found * accumulate}, "
                f"configured {effective})"
            )
        else:
            advice = (
                f"the configured {configured} fits. A larger batch makes epochs faster: with "
                f"--data.init_args.batch_size {found}, scale the learning rate about linearly (x{found / configured:g})"
            )
        report(trainer, f"Batch-size finder: {found} is the {limit}; {advice}", {"tuning/batch_size": found})
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
        lightning_setattr(pl_module, self._batch_arg_name, batch_size)
        trainer.accumulate_grad_batches = accumulate
        _reset_dataloaders(trainer)
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
        try:
            return len(loader.dataset)
        except (AttributeError, TypeError):  # several loaders, or an iterable dataset: no bound
            return None
