"""Callbacks: extra behaviour around training, attached through Lightning hooks only."""

from project.callbacks.checkpoint import BestAndLastCheckpoint
from project.callbacks.prediction_writer import PredictionWriter

__all__ = ["BestAndLastCheckpoint", "PredictionWriter"]
