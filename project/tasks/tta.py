"""Test-time augmentation: a network's logits averaged over mirrored and shifted views of each image."""

import torch.nn.functional as F
from torch import Tensor, nn


def tta_logits(net: nn.Module, x: Tensor, flip: bool = True, shift: int = 0) -> Tensor:
    """The mean logits of `x` and its mirror image (`flip`), and, with `shift`, of the images shifted by
    `shift` pixels up-left and down-right (reflect padded), weighted 1/2 for the unshifted views and 1/4
    for each shift: airbench's TTA level 2."""

    def views(v: Tensor) -> Tensor:
        return (net(v) + net(v.flip(-1))) / 2 if flip else net(v)

    logits = views(x)
    if shift:
        h, w = x.shape[-2:]
        padded = F.pad(x, (shift,) * 4, mode="reflect")
        up_left, down_right = padded[..., :h, :w], padded[..., 2 * shift :, 2 * shift :]
        logits = logits / 2 + (views(up_left) + views(down_right)) / 4
    return logits
