"""A PyTorch Lightning starter template for image classification."""

__version__ = "0.1.0"
