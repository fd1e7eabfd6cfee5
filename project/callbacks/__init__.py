"""Callbacks: extra behaviour around training, attached through Lightning hooks only."""

from project.callbacks.checkpoint import BestAndLastCheckpoint
from project.callbacks.data_wait import DataWaitMonitor
from project.callbacks.effective_batch_size import EffectiveBatchSize
from project.callbacks.grad_norm import GradientNormMonitor
from project.callbacks.nonfinite import NonFiniteError, NonFiniteGuard
from project.callbacks.prediction_writer import PredictionWriter
from project.callbacks.pruning import ProgressivePruning
from project.callbacks.qat import QuantizationAwareTraining
from project.callbacks.throughput import ImageThroughputMonitor
from project.callbacks.update_ratio import UpdateRatioMonitor
from project.callbacks.wandb_dashboard import WandbDashboard

__all__ = [
    "BestAndLastCheckpoint",
    "EffectiveBatchSize",
    "PredictionWriter",
    # issue 5: pruning, QAT, training diagnostics, W&B dashboards
    "DataWaitMonitor",
    "GradientNormMonitor",
    "ImageThroughputMonitor",
    "NonFiniteError",
    "NonFiniteGuard",
    "ProgressivePruning",
    "QuantizationAwareTraining",
    "UpdateRatioMonitor",
    "WandbDashboard",
]
