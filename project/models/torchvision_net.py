"""Any torchvision classification model by name, for custom datasets and other image sizes."""

import torch
import torchvision
from torch import Tensor, nn


class TorchvisionNet(nn.Module):
    """Wraps `torchvision.models.get_model(name)` and fits its head to `num_classes`.

    Args:
        name: A classification model name, e.g. `resnet18`, `resnet50`, `mobilenet_v3_small`,
            `efficientnet_b0`, `convnext_tiny` (see `torchvision.models.list_models(torchvision.models)`).
        num_classes: Number of output logits (linked from the DataModule).
        weights: Pretrained weights, e.g. `DEFAULT` or `IMAGENET1K_V1` (downloaded once by torchvision);
            `None` trains from scratch. With weights, the original head is replaced by a fresh one.
    """

    def __init__(self, name: str = "resnet18", num_classes: int = 10, weights: str | None = None) -> None:
        super().__init__()
        available = torchvision.models.list_models(torchvision.models)
        if name not in available:
            raise ValueError(
                f"TorchvisionNet: unknown model name {name!r}; choose one of: {', '.join(available)}"
            )
        if weights is None:
            self.net = torchvision.models.get_model(name, num_classes=num_classes)
        else:
            self.net = torchvision.models.get_model(name, weights=weights)
            _replace_head(self.net, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _replace_head(net: nn.Module, num_classes: int) -> None:
    """Swap the last `nn.Linear` of a pretrained model for one with `num_classes` outputs."""
    name, last = next((n, m) for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear))
    parent = net.get_submodule(name.rpartition(".")[0]) if "." in name else net
    with torch.no_grad():
        setattr(parent, name.rpartition(".")[2], nn.Linear(last.in_features, num_classes))
