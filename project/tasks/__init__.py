"""LightningModules, one per task: the optimisation logic around an injected network (`task.ImageTask`)."""

from project.tasks.image_classifier import ImageClassifier
from project.tasks.task import ImageTask

__all__ = ["ImageClassifier", "ImageTask"]

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {"tasks": {"ImageClassifier": ".image_classifier"}}
