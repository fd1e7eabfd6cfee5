"""`EffectiveBatchSize`: resolves `data.global_batch_size` for the run and reports the effective batch size."""

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info


class EffectiveBatchSize(Callback):
    """Prints, once (rank 0), how many samples each optimizer step sees, and where that number comes from.

    The number that matters for the learning rate is per-device batch x processes x accumulated batches, and
    it changes silently when a run moves from one GPU to eight, or gains `accumulate_grad_batches`. When the
    DataModule has a `global_batch_size`, this callback derives the per-device batch size from it as soon as
    the world size is known (before any loader is built), so a size that does not divide fails before
    training starts.
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = trainer.datamodule
        if hasattr(datamodule, "resolve_batch_size"):
            datamodule.resolve_batch_size(trainer.world_size, trainer.accumulate_grad_batches)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        per_device = getattr(trainer.train_dataloader, "batch_size", None)
        if per_device is None:  # a custom batch sampler: nothing reliable to report
            return
        accumulate = trainer.accumulate_grad_batches
        effective = per_device * trainer.world_size * accumulate
        rank_zero_info(
            f"Effective batch size: {effective} samples per optimizer step = {per_device} per device x "
            f"{trainer.num_devices} device(s) x {trainer.num_nodes} node(s) x {accumulate} accumulated batch(es)"
        )
