"""Any torchvision classification model by name, for custom datasets and other image sizes."""

from pathlib import Path

import torch
import torchvision
from torch import Tensor, nn

from project.models.downloads import DOWNLOAD_ERRORS, download_failed


class TorchvisionNet(nn.Module):
    """Wraps `torchvision.models.get_model(name)` and fits its head to `num_classes`.

    With `weights`, torchvision downloads them once into `$TORCH_HOME/hub/checkpoints` (default
    `~/.cache/torch/hub/checkpoints`) and the data is normalised the way they were trained (`input_stats`)
    unless the config sets `data.mean`/`data.std`.

    Args:
        name: A classification model name, e.g. `resnet18`, `resnet50`, `mobilenet_v3_small`,
            `efficientnet_b0`, `convnext_tiny` (see `torchvision.models.list_models(torchvision.models)`).
        num_classes: Number of output logits (linked from the DataModule).
        weights: Pretrained weights, e.g. `DEFAULT` or `IMAGENET1K_V1` (downloaded once by torchvision);
            `None` trains from scratch. With weights, the original head is replaced by a fresh one.
        weights_file: Load the pretrained weights from this local file instead of downloading them (a state
            dict of `name`, e.g. a copy of torchvision's file, `.pth` or `.safetensors`); the data is normalised
            as `weights` (default `DEFAULT`) says. A file that fills only some of the network's tensors (another
            architecture's) is refused, naming what did not match.
        allow_partial: Accept a `weights_file` that fills only some of the network's tensors: the others keep
            their random initialisation (one warning line says how many matched).
    """

    def __init__(
        self,
        name: str = "resnet18",
        num_classes: int = 10,
        weights: str | None = None,
        weights_file: str | None = None,
        allow_partial: bool = False,
    ) -> None:
        super().__init__()
        available = torchvision.models.list_models(torchvision.models)
        if name not in available:
            raise ValueError(
                f"TorchvisionNet: unknown model name {name!r}; choose one of: {', '.join(available)}"
            )
        self.weights = None
        if weights is None and weights_file is None:
            self.net = torchvision.models.get_model(name, num_classes=num_classes)
        else:
            enum = torchvision.models.get_model_weights(name)
            weights = weights or "DEFAULT"
            if weights not in enum.__members__:
                raise ValueError(
                    f"TorchvisionNet: {name} has no weights {weights!r}; choose one of: "
                    f"{', '.join(enum.__members__)}"
                )
            self.weights = enum[weights]
            if weights_file is None:
                try:
                    self.net = torchvision.models.get_model(name, weights=self.weights)
                except DOWNLOAD_ERRORS as e:
                    owner, scratch = "model.net TorchvisionNet", "--model.net.init_args.weights null"
                    raise download_failed(owner, name, e, scratch) from None
            else:
                from project.models.weights_file import load_weights_file  # (only runs that use it)

                self.net = torchvision.models.get_model(name)
                path = Path(weights_file).expanduser()
                head = _last_linear(self.net)[0]
                load_weights_file(self.net, path, "model.net TorchvisionNet", head, allow_partial)
            _replace_head(self.net, num_classes)
        self._head = _last_linear(self.net)[0]

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def input_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The per-channel mean and std the weights were trained with, or None when training from scratch."""
        if self.weights is None:
            return None
        preset = self.weights.transforms()
        return tuple(preset.mean), tuple(preset.std)

    def head_parameter_names(self) -> list[str]:
        """The names (in `named_parameters()`) of the head's parameters: the last linear layer (`fc`,
        `classifier.1`, `heads.head`, ...), the one replaced for `num_classes`."""
        head = self.net.get_submodule(self._head)
        return [f"net.{self._head}.{n}" for n, _ in head.named_parameters()]


def _last_linear(net: nn.Module) -> tuple[str, nn.Linear]:
    """The network's last `nn.Linear` (its classifier), by name; the head this wrapper fits and names."""
    found = next(((n, m) for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear)), None)
    if found is None:  # SqueezeNet's classifier is a convolution
        raise ValueError(
            f"TorchvisionNet: {type(net).__name__} has no linear classifier (nn.Linear) to fit to the data's "
            "classes; choose a model that ends in one (resnet18, efficientnet_b0, convnext_tiny, ...)"
        )
    return found


def _replace_head(net: nn.Module, num_classes: int) -> None:
    """Swap the last `nn.Linear` of a pretrained model for one with `num_classes` outputs."""
    name, last = _last_linear(net)
    parent = net.get_submodule(name.rpartition(".")[0]) if "." in name else net
    with torch.no_grad():
        setattr(parent, name.rpartition(".")[2], nn.Linear(last.in_features, num_classes))
