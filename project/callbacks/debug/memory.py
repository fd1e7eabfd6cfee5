"""`CUDAMemoryRecorder`: what fills GPU memory, as a snapshot for pytorch.org/memory_viz and a summary per epoch."""

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.memory import is_oom_error

from project.errors import UserError

GIB = 1024**3


class CUDAMemoryRecorder(Callback):
    """Records every CUDA allocation (with its Python stack) during `fit` and dumps it for the memory viewer.

    `memory_snapshot_step<N>.pickle` is written after training step `snapshot_step` (by then weights,
    gradients, optimizer state and activations have all been allocated: the steady state), and
    `memory_snapshot_oom.pickle` if the run dies of an out-of-memory error. Drag either file onto
    https://pytorch.org/memory_viz to see which tensors, allocated where, fill the memory over time.
    At the end of each training epoch, `torch.cuda.memory_summary()` is printed and the peak allocated
    and reserved memory are logged as `memory/max_allocated_gib` and `memory/max_reserved_gib`.

    On a CPU run it only says that it needs CUDA, and the run goes on unchanged.

    Args:
        snapshot_step: Training step (optimizer steps) after which the snapshot is dumped.
        keep_recording: Keep recording after that dump, so that an out-of-memory error later in the run
            is dumped too. Recording costs a little time per allocation.
        max_entries: Allocation events kept (the most recent ones).
        summary: Print the memory summary at the end of each training epoch.
        dirpath: Where the snapshots go. Default: the run's log directory.
    """

    def __init__(
        self,
        snapshot_step: int = 5,
        keep_recording: bool = True,
        max_entries: int = 100_000,
        summary: bool = True,
        dirpath: str | None = None,
    ) -> None:
        if snapshot_step < 1 or max_entries < 1:
            raise UserError(
                f"CUDAMemoryRecorder: snapshot_step and max_entries must be at least 1, got {snapshot_step} "
                f"and {max_entries}"
            )
        self.snapshot_step = snapshot_step
        self.keep_recording = keep_recording
        self.max_entries = max_entries
        self.summary = summary
        self.dirpath = dirpath
        self.snapshots: list[Path] = []
        self._device: torch.device | None = None
        self._recording = False
        self._dumped_step = False

    @staticmethod
    def _uses_cuda(trainer: L.Trainer) -> bool:
        return trainer.strategy.root_device.type == "cuda"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not self._uses_cuda(trainer):
            rank_zero_warn(
                f"CUDAMemoryRecorder (configs/debug/memory.yaml) needs CUDA, and this run is on "
                f"{trainer.strategy.root_device.type}: no memory snapshot or summary will be written. For CPU "
                "memory, profile with configs/debug/profile.yaml and --trainer.profiler.init_args.profile_memory true."
            )
            return
        self._device = trainer.strategy.root_device
        # Started in setup, before the model moves to the GPU, so the weights' allocations are recorded too.
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        torch.cuda.reset_peak_memory_stats(self._device)
        self._recording = True

    def _dump(self, trainer: L.Trainer, name: str) -> None:
        folder = Path(self.dirpath or trainer.log_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        rank = f"-rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        path = folder / f"{name}{rank}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        self.snapshots.append(path)
        print(f"CUDA memory snapshot: {path} (open it at https://pytorch.org/memory_viz)", flush=True)

    def _stop(self) -> None:
        if self._recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._recording and not self._dumped_step and trainer.global_step >= self.snapshot_step:
            self._dump(trainer, f"memory_snapshot_step{trainer.global_step}")
            self._dumped_step = True
            if not self.keep_recording:
                self._stop()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._device is None:
            return
        if self.summary and trainer.is_global_zero:
            print(torch.cuda.memory_summary(self._device, abbreviated=True), flush=True)
        peaks = {
            "memory/max_allocated_gib": torch.cuda.max_memory_allocated(self._device) / GIB,
            "memory/max_reserved_gib": torch.cuda.max_memory_reserved(self._device) / GIB,
        }
        pl_module.log_dict(peaks, on_epoch=True, rank_zero_only=True)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._recording and (isinstance(exception, torch.OutOfMemoryError) or is_oom_error(exception)):
            self._dump(trainer, "memory_snapshot_oom")
        self._stop()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop()
