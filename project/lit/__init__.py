"""LightningModules, one per task: the optimisation logic around an injected network (`task.ImageTask`)."""

from project.lit.image_classifier import ImageClassifier
from project.lit.multilabel_classifier import MultiLabelClassifier
from project.lit.task import ImageTask

__all__ = ["ImageClassifier", "ImageTask", "MultiLabelClassifier"]
