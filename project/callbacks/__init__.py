"""Callbacks: extra behaviour around training, attached through Lightning hooks only.

Grouped like `configs/`: the default ones here (checkpoints, predictions, effective batch size),
`diagnostics/` (on by default: gradient norms, the non-finite guard, data wait, the W&B dashboard; opt-in:
update ratios, throughput), `tuning/` (LR and batch-size finders), `debug/` (CUDA memory, profiler); training aids of particular recipes beside them (`PatchWhiteningInit`,
`Lookahead`). Pruning
and QAT live in `project.compression`. Every callback is exported here, so configs name it by its class alone
(`class_path: ProgressivePruning`).
"""

from project.callbacks.checkpoint import BestAndLastCheckpoint
from project.callbacks.debug.memory import CUDAMemoryRecorder
from project.callbacks.debug.profiler import ScheduledProfiler
from project.callbacks.diagnostics.data_wait import DataWaitMonitor
from project.callbacks.diagnostics.grad_norm import GradientNormMonitor
from project.callbacks.diagnostics.nonfinite import NonFiniteError, NonFiniteGuard
from project.callbacks.diagnostics.throughput import ImageThroughputMonitor
from project.callbacks.diagnostics.update_ratio import UpdateRatioMonitor
from project.callbacks.diagnostics.wandb_dashboard import WandbDashboard
from project.callbacks.effective_batch_size import EffectiveBatchSize
from project.callbacks.lookahead import Lookahead
from project.callbacks.prediction_writer import PredictionWriter
from project.callbacks.tuning.batch_size_finder import MaxBatchSizeFinder
from project.callbacks.tuning.lr_finder import LRFinder
from project.callbacks.whitening import PatchWhiteningInit
from project.compression.pruning import ProgressivePruning
from project.compression.qat import QuantizationAwareTraining

__all__ = [
    "MaxBatchSizeFinder",
    "BestAndLastCheckpoint",
    "CUDAMemoryRecorder",
    "DataWaitMonitor",
    "EffectiveBatchSize",
    "GradientNormMonitor",
    "ImageThroughputMonitor",
    "LRFinder",
    "Lookahead",
    "NonFiniteError",
    "NonFiniteGuard",
    "PatchWhiteningInit",
    "PredictionWriter",
    "ProgressivePruning",
    "QuantizationAwareTraining",
    "ScheduledProfiler",
    "UpdateRatioMonitor",
    "WandbDashboard",
]
