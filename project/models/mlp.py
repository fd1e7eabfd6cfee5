"""A two-layer perceptron: the baseline every image model should beat."""

from torch import Tensor, nn

from project.models.init import init_weights


class MLP(nn.Module):
    """Flatten -> Linear -> ReLU -> Dropout -> Linear.

    Args:
        num_classes: Number of output logits (linked from the DataModule).
        input_shape: (channels, height, width) of the input (linked from the DataModule).
        hidden: Width of the hidden layer.
        dropout: Dropout after the hidden layer.
    """

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (3, 32, 32),
        hidden: int = 512,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        c, h, w = input_shape
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        init_weights(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
