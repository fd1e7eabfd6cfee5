"""`SimpleCNN`: the classic first CIFAR network, as introductory tutorials write it."""

import torch.nn.functional as F
from torch import Tensor, nn


class SimpleCNN(nn.Module):
    """Two conv layers and two linear layers, the first network of many CIFAR tutorials:

        Conv2d(3, 32, 3, 1, 1) -> ReLU -> MaxPool2d(2) -> Conv2d(32, 64, 3, 1, 1) -> ReLU -> MaxPool2d(2)
        -> Linear(64 * 8 * 8, 256) -> ReLU -> Linear(256, 10)

    with PyTorch's default initialisation (about 1.07M parameters). The usual recipe trains it with Adam (lr 1e-3),
    batch 64 and per-image random crop and flip: `benchmarks/fit_vs_plain.py` is that recipe, side by side with
    `python -m project fit`. On inputs other than 32x32 the features are average-pooled to 8x8 before the
    classifier, so the same network runs on any image size; on 32x32 nothing is added.

    Args:
        num_classes: Number of output logits (linked from the DataModule).
        in_channels: Input channels (3 for RGB).
        width: Channels of the first conv layer; the second has twice as many.
        hidden: Width of the hidden linear layer.
        kernel_size: Side of the conv kernels (odd; padded to keep the size): 3 in the classic network, 5 a wider variant.
        dropout: Dropout before the last layer.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        width: int = 32,
        hidden: int = 256,
        kernel_size: int = 3,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"SimpleCNN: kernel_size must be odd and positive, got {kernel_size}")
        padding = kernel_size // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size, 1, padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, kernel_size, 1, padding),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 8 * 8, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        if x.shape[-2] != 8 or x.shape[-1] != 8:  # not a 32x32 input
            x = F.adaptive_avg_pool2d(x, 8)
        return self.classifier(x)
