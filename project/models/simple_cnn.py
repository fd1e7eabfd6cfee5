"""The classic first CIFAR network: two conv layers and two linear layers."""

from torch import Tensor, nn

from project.models.init import init_weights


class SimpleCNN(nn.Module):
    """conv(5x5) -> pool -> conv(5x5) -> pool -> linear -> linear.

    An adaptive pool before the classifier makes it work for any input size, so the same net runs
    on CIFAR (32x32) and on small custom datasets.

    Args:
        num_classes: Number of output logits (linked from the DataModule).
        in_channels: Input channels (3 for RGB).
        width: Channels of the first conv layer; the second has twice as many.
        hidden: Width of the hidden linear layer.
        dropout: Dropout before the last layer.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        width: int = 32,
        hidden: int = 256,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(8),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 8 * 8, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        init_weights(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
