"""`AirbenchNet`: the small VGG-style CIFAR network of the fastest public CIFAR-10 trainers.

After Keller Jordan's airbench (2024): a frozen 2x2 patch-whitening convolution, three conv groups
(conv -> max-pool -> BN -> GELU -> conv -> BN -> GELU) of widths 64/256/256, a global max-pool and a
linear head scaled by 1/9. About 2M parameters; 94% CIFAR-10 test accuracy in ~10 epochs on one GPU with
the recipe in configs/experiment/cifar10_speedrun.yaml.

The whitening layer is initialised from data (the eigenvectors of the covariance of 2x2 training patches):
call `init_whitening(images)` once before training; the `PatchWhiteningInit` callback does it.
"""

import torch
from torch import Tensor, nn


class _BatchNorm(nn.BatchNorm2d):
    """BatchNorm with a frozen unit scale (only the shift trains) and fast-moving statistics."""

    def __init__(self, num_features: int, momentum: float = 0.6, eps: float = 1e-12) -> None:
        super().__init__(num_features, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad = False


class _ConvGroup(nn.Sequential):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(
            nn.Conv2d(channels_in, channels_out, 3, padding="same", bias=False),
            nn.MaxPool2d(2),
            _BatchNorm(channels_out),
            nn.GELU(),
            nn.Conv2d(channels_out, channels_out, 3, padding="same", bias=False),
            _BatchNorm(channels_out),
            nn.GELU(),
        )


class AirbenchNet(nn.Module):
    """The airbench94 network.

    Args:
        num_classes: Number of output logits (linked from the DataModule).
        widths: Channels of the three conv groups.
        in_channels: Input channels (3 for RGB).
        head_scale: Multiplier of the logits (1/9 in airbench; keeps early logits small).
    """

    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, int, int] = (64, 256, 256),
        in_channels: int = 3,
        head_scale: float = 1 / 9,
    ) -> None:
        super().__init__()
        whiten_width = 2 * in_channels * 2 * 2
        self.whiten = nn.Conv2d(in_channels, whiten_width, kernel_size=2, padding=0, bias=True)
        self.whiten.weight.requires_grad = False  # set from data by init_whitening, then frozen
        self.layers = nn.Sequential(
            nn.GELU(),
            _ConvGroup(whiten_width, widths[0]),
            _ConvGroup(widths[0], widths[1]),
            _ConvGroup(widths[1], widths[2]),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(widths[2], num_classes, bias=False)
        self.head_scale = head_scale
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m is not self.whiten:
                # Partly identity at start (airbench's dirac init): the signal passes through unchanged.
                nn.init.dirac_(m.weight[: m.in_channels])

    @torch.no_grad()
    def init_whitening(self, images: Tensor, eps: float = 5e-4) -> None:
        """Set the 2x2 whitening filters from normalised training images (N, C, H, W); ~5,000 are plenty."""
        c, k = self.whiten.in_channels, self.whiten.kernel_size[0]
        # (N, C, H', W', kh, kw) -> one row per patch, ordered (c, kh, kw) like the conv weight.
        patches = (
            images.double().unfold(2, k, 1).unfold(3, k, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k)
        )
        patches = patches - patches.mean(dim=0)
        cov = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(cov)
        filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).reshape(-1, c, k, k)
        # Each direction twice, with both signs, so the GELU after it keeps the information of both halves.
        self.whiten.weight.copy_(torch.cat([filters, -filters]))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.layers(self.whiten(x))) * self.head_scale
