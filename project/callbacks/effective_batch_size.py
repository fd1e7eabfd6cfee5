"""`EffectiveBatchSize`: reports how many samples each optimizer step sees."""

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info


class EffectiveBatchSize(Callback):
    """Prints, once (rank 0), how many samples each optimizer step sees, and where that number comes from.

    The number that matters for the learning rate is per-device batch x processes x accumulated batches, and
    it changes silently when a run moves from one GPU to eight, or gains `accumulate_grad_batches`. The
    per-device batch is the training loader's, which the DataModule derives from its `global_batch_size` when
    that is set (an error there, before the first step, when it does not divide).
    """

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
