"""Weight initialisation shared by the networks."""

from typing import cast

from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock, Bottleneck


def init_weights(net: nn.Module, zero_init_residual: bool = True) -> nn.Module:
    """Kaiming-normal for conv/linear weights, zero biases, BatchNorm weight 1 / bias 0.

    With `zero_init_residual`, the last BatchNorm of every residual block starts at zero so each block
    begins as the identity (Goyal et al., 2017): deep ResNets then train stably at large learning rates.
    """
    for m in net.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.kaiming_normal_(
                m.weight, mode="fan_out" if isinstance(m, nn.Conv2d) else "fan_in", nonlinearity="relu"
            )
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if zero_init_residual:
        for m in net.modules():
            # torchvision types the blocks' norm layers as any Module; they are BatchNorm2d, weight a Parameter.
            if isinstance(m, Bottleneck):
                nn.init.zeros_(cast(Tensor, m.bn3.weight))
            elif isinstance(m, BasicBlock):
                nn.init.zeros_(cast(Tensor, m.bn2.weight))
    return net
