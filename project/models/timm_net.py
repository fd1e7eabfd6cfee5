"""Any timm model by name (700+ architectures, most with pretrained weights), its head fitted to the data.

timm is imported when a `TimmNet` is built, not when this module is: a run with another network never loads it.
"""

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from project.errors import UserError
from project.models.downloads import DOWNLOAD_ERRORS, download_failed, unreachable


class TimmNet(nn.Module):
    """Wraps `timm.create_model(name)` with a fresh head of `num_classes` outputs.

    With `pretrained`, timm downloads the weights once from the Hugging Face hub into its cache
    (`~/.cache/huggingface/hub`, or `$HF_HOME/hub`), then loads every layer but the head. The data is then
    normalised the way the weights were trained (`input_stats`) unless the config sets `data.mean`/`data.std`.

    Args:
        name: A timm model name, with or without a weight tag, e.g. `resnet18.a1_in1k`, `resnet50`,
            `efficientnet_b0.ra_in1k`, `convnext_tiny.fb_in22k`, `vit_small_patch16_224.augreg_in21k`
            (`timm.list_models(pretrained=True)`).
        num_classes: Number of output logits (linked from the DataModule).
        input_shape: (channels, height, width) of one input (linked from the DataModule); the channels set the
            first convolution's input channels (timm adapts pretrained weights to 1 or 4 channels).
        pretrained: Start from the pretrained weights of `name` (downloaded once; see above).
        weights_file: Load the pretrained weights from this local file instead of downloading them (a
            `.safetensors` or `.pth` state dict of the same architecture, e.g. a copy of the hub's file on a
            machine without a network). Implies `pretrained`. A file that fills only some of the network's
            tensors (another architecture's) is refused, naming what did not match.
        allow_partial: Accept a `weights_file` that fills only some of the network's tensors: the others keep
            their random initialisation (one warning line says how many matched).
        drop_rate: Dropout before the classifier.
        drop_path_rate: Stochastic depth: the rate at which residual blocks are skipped in training, rising with
            depth (0.05-0.2 is usual when fine-tuning; 0: off).
        grad_checkpointing: Recompute activations in the backward pass instead of keeping them: less memory
            for larger batches or images, about a third more compute. Only for models that support it.
        model_kwargs: Further arguments of the model's constructor, e.g. `{img_size: 96}` for a ViT trained at
            another resolution.
    """

    def __init__(
        self,
        name: str = "resnet18.a1_in1k",
        num_classes: int = 10,
        input_shape: tuple[int, int, int] | None = None,
        pretrained: bool = False,
        weights_file: str | None = None,
        allow_partial: bool = False,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        grad_checkpointing: bool = False,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        import timm  # here: only runs that use a timm model pay for importing it

        if not timm.is_model(name):
            close = timm.list_models(f"*{name.split('.')[0]}*")[:10]
            hint = f"; similar names: {', '.join(close)}" if close else ""
            raise UserError(f"model.net TimmNet: unknown timm model name {name!r}{hint}")
        kwargs: dict[str, Any] = dict(model_kwargs or {})
        if input_shape is not None:
            kwargs["in_chans"] = input_shape[0]
        self.in_chans = int(kwargs.get("in_chans", 3))
        self.pretrained = pretrained or weights_file is not None
        settings: dict[str, Any] = dict(
            num_classes=num_classes, drop_rate=drop_rate, drop_path_rate=drop_path_rate, **kwargs
        )
        if weights_file is None:
            # Typed loosely: timm's models carry methods (get_classifier, group_matcher) nn.Module does not declare.
            self.net: Any = (
                _pretrained(name, settings) if self.pretrained else timm.create_model(name, **settings)
            )
        else:
            self.net = _from_weights_file(name, Path(weights_file).expanduser(), allow_partial, settings)
        if grad_checkpointing:
            self.net.set_grad_checkpointing(True)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def input_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The per-channel mean and std the pretrained weights expect, or None when training from scratch."""
        if not self.pretrained:
            return None
        from timm.data.config import resolve_data_config

        config = resolve_data_config({}, model=self.net)
        mean, std = tuple(config["mean"]), tuple(config["std"])
        channels = self.in_chans
        if len(mean) != channels:  # RGB weights adapted to grey or 4-channel input: the channels' average
            mean, std = (sum(mean) / len(mean),) * channels, (sum(std) / len(std),) * channels
        return mean, std

    def head_parameter_names(self) -> list[str]:
        """The names (in `named_parameters()`) of the new head's parameters: the classifier timm replaced."""
        head = {id(p) for p in self.net.get_classifier().parameters()}
        return [n for n, p in self.named_parameters() if id(p) in head]

    def layer_ids(self) -> dict[str, int]:
        """Each parameter's depth, 0 (the stem) to the head's, for layer-wise learning-rate decay: timm's own
        grouping of the model's blocks (`group_matcher`, as `timm.optim.param_groups_layer_decay` uses)."""
        from timm.models import group_parameters

        if not hasattr(self.net, "group_matcher"):
            return {}
        ids: Any = group_parameters(self.net, self.net.group_matcher(coarse=False), reverse=True)
        return {f"net.{n}": int(i) for n, i in ids.items()}


@contextlib.contextmanager
def _hub_cache_only() -> Iterator[None]:
    """The Hugging Face hub's offline mode for the block: its files come from the local cache, at once."""
    from huggingface_hub import constants

    offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = offline


def _pretrained(name: str, settings: dict[str, Any]) -> Any:
    """`timm.create_model(name, pretrained=True)`: from the cache when the weights are there; else downloaded,
    or one line at once where they cannot be (the hub's client would retry for most of a minute first)."""
    import timm
    from huggingface_hub import constants

    owner, scratch = "model.net TimmNet", "--model.net.init_args.pretrained false"
    try:
        with _hub_cache_only():
            return timm.create_model(name, pretrained=True, **settings)
    except DOWNLOAD_ERRORS:
        pass  # not in the cache (yet)
    if not constants.HF_HUB_OFFLINE and unreachable(constants.ENDPOINT):
        raise download_failed(owner, name, f"{constants.ENDPOINT} cannot be reached", scratch)
    try:
        return timm.create_model(name, pretrained=True, **settings)
    except DOWNLOAD_ERRORS as e:
        raise download_failed(owner, name, e, scratch) from None


def _from_weights_file(name: str, path: Path, allow_partial: bool, settings: dict[str, Any]) -> Any:
    """`timm.create_model(name)` loaded from the local file `path` through the loader a download goes through
    (head dropped, channels adapted), the file checked first and the load after (project.models.weights_file)."""
    import timm

    from project.models.weights_file import check_loaded, shape_mismatches, weight_shapes

    owner = "model.net TimmNet"
    if not path.is_file():
        raise UserError(f"{owner}: weights_file {path} does not exist")
    in_file = weight_shapes(path, owner)
    # timm's "Unexpected keys (...)" line lists every key: check_loaded says it in one line instead.
    builder = logging.getLogger("timm.models._builder")
    level = builder.level
    builder.setLevel(logging.ERROR)
    try:
        net: Any = timm.create_model(
            name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **settings
        )
    except RuntimeError as e:
        if "size mismatch" not in str(e) and "inconsistent" not in str(e):
            raise
        fresh: Any = timm.create_model(name, pretrained=False, **settings)
        raise shape_mismatches(fresh.state_dict(), in_file, path, owner) from None
    finally:
        builder.setLevel(level)
    classifier = net.pretrained_cfg.get("classifier") or ()
    head = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    check_loaded(net.state_dict(), in_file, head, path, owner, allow_partial)
    return net
