"""LightningModules: the optimisation logic around an injected network."""

from project.lit.image_classifier import ImageClassifier

__all__ = ["ImageClassifier"]
