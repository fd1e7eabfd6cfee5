"""ResNet-18/34 for 32x32 inputs, built on torchvision's ResNet.

ImageNet ResNets open with a 7x7 stride-2 conv and a max-pool, which shrink a 32x32 CIFAR image to 8x8
before the first block and cost several points of accuracy. The CIFAR variant (He et al., 2016; the
common "ResNet-18 for CIFAR" of kuangliu/pytorch-cifar) uses a 3x3 stride-1 stem and no max-pool.
"""

from typing import Literal

from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from project.models.init import init_weights

_LAYERS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}


class CIFARResNet(ResNet):
    """torchvision's ResNet with a 3x3 stride-1 stem and no max-pool.

    Args:
        num_classes: Number of output logits (linked from the DataModule).
        depth: 18 or 34 (BasicBlock ResNets).
        in_channels: Input channels (3 for RGB).
        zero_init_residual: Zero the last BatchNorm of each block so blocks start as the identity.
    """

    def __init__(
        self,
        num_classes: int = 10,
        depth: Literal[18, 34] = 18,
        in_channels: int = 3,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__(BasicBlock, _LAYERS[depth], num_classes=num_classes)
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.maxpool = nn.Identity()
        init_weights(self, zero_init_residual=zero_init_residual)
