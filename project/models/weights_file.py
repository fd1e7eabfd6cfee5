"""A pretrained network's `weights_file`: read safely, and loaded whole or refused in one line.

A file whose keys match none of the network's would leave it at its random initialisation, to be trained as if
pretrained (with the pretrained weights' normalisation); one of a related architecture (a resnet34 file for a
resnet18) loads in part. Both are refused, naming how many tensors matched and the first names that did not,
unless the network's `allow_partial` accepts a partial load. The file is read with `weights_only=True` (tensors
and plain values only): a pickled object (a whole saved model) is refused, not loaded.
"""

import importlib.util
import re
import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.errors import UserError, warn

SHOWN = 3  # names listed in a message
#: Where timm's and torchvision's loaders find the weights inside a training checkpoint (timm prefers the EMA).
NESTED = ("state_dict_ema", "model_ema", "state_dict", "model")
WRAPPERS = ("module.", "_orig_mod.")  # prefixes DDP and torch.compile add to every key


def weight_shapes(path: Path, owner: str) -> dict[str, tuple[int, ...]]:
    """{key: shape} of the tensors in the weights file `path` (a `.safetensors` file or a `torch.save`d state
    dict, possibly inside a checkpoint), read without loading the tensors where the format allows.
    Raises UserError naming the file when it is not one, or holds pickled objects."""
    if path.suffix == ".safetensors":
        return _safetensors_shapes(path, owner)
    return {k: tuple(v.shape) for k, v in read_tensors(path, owner, mmap=True).items()}


def read_tensors(path: Path, owner: str, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in the weights file `path`, as timm and torchvision find it (a checkpoint's
    `state_dict`/`model` entry; the prefixes DDP and torch.compile add removed). `mmap`: a zip archive
    (torch.save's format) is memory-mapped, its tensors read only when used. Raises UserError as `weight_shapes`."""
    if path.suffix == ".safetensors":
        _needs_safetensors(owner)
        from safetensors.torch import load_file

        try:
            return _state_dict(load_file(str(path)), path, owner)
        except Exception as e:
            raise _not_weights(path, owner, _first_line(e)) from None
    with open(path, "rb") as f:
        head = f.read(1)
    if not zipfile.is_zipfile(path) and head != b"\x80":
        raise _not_weights(path, owner, "truncated, or a file of another kind")
    try:
        content = torch.load(
            path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path)
        )
    except Exception as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found:
            raise UserError(
                f"{owner}: weights_file {path} holds pickled Python objects ({found.group(1)}), not only "
                "tensors: refused, since unpickling them could run code. Save the network's weights alone: "
                "torch.save(model.state_dict(), path), or a .safetensors file"
            ) from None
        raise _not_weights(path, owner, _first_line(e)) from None
    return _state_dict(content, path, owner)


def _safetensors_shapes(path: Path, owner: str) -> dict[str, tuple[int, ...]]:
    _needs_safetensors(owner)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118 (no __iter__)
    except Exception as e:
        raise _not_weights(path, owner, _first_line(e)) from None


def _state_dict(content: Any, path: Path, owner: str) -> dict[str, torch.Tensor]:
    if isinstance(content, Mapping):
        nested = next((content[k] for k in NESTED if isinstance(content.get(k), Mapping)), None)
        content = nested if nested is not None else content
    if not isinstance(content, Mapping) or not any(isinstance(v, torch.Tensor) for v in content.values()):
        raise _not_weights(
            path, owner, f"it holds a {type(content).__name__} without tensors, not a state dict"
        )
    tensors = {}
    for key, value in content.items():
        if isinstance(value, torch.Tensor):
            while str(key).startswith(WRAPPERS):
                key = next(str(key)[len(p) :] for p in WRAPPERS if str(key).startswith(p))
            tensors[str(key)] = value
    return tensors


def load_weights_file(net: nn.Module, path: Path, owner: str, head: str, allow_partial: bool) -> None:
    """Load the weights file `path` into `net`, all but its layer `head` (replaced for the data's classes after):
    refused in one line when it does not fit (`check_loaded`, `shape_mismatches`)."""
    if not path.is_file():
        raise UserError(f"{owner}: weights_file {path} does not exist")
    tensors = read_tensors(path, owner)
    in_file = {k: tuple(v.shape) for k, v in tensors.items()}
    own = {k: v for k, v in net.state_dict().items() if not k.startswith(f"{head}.")}
    if any(k in in_file and tuple(v.shape) != in_file[k] for k, v in own.items()):
        raise shape_mismatches(own, in_file, path, owner)
    check_loaded(net.state_dict(), in_file, (head,), path, owner, allow_partial)
    net.load_state_dict({k: v for k, v in tensors.items() if k in own}, strict=False)


def check_loaded(
    network: Mapping[str, Any],
    in_file: Mapping[str, tuple[int, ...]],
    head: Collection[str],
    path: Path,
    owner: str,
    allow_partial: bool,
) -> None:
    """Refuse (UserError) a weights file that fills only some of the `network`'s tensors (its state_dict keys),
    `head` (the prefixes of the layers replaced for the data's classes) apart; with `allow_partial`, one
    warning line instead, as long as something matched."""
    in_head = tuple(f"{h}." for h in head)
    wanted = [k for k in network if not k.startswith(in_head) and not k.endswith("num_batches_tracked")]
    missing = [k for k in wanted if k not in in_file]
    unexpected = [k for k in in_file if k not in network and not k.startswith(in_head)]
    matched = len(wanted) - len(missing)
    if not missing and not unexpected:
        return
    if matched == 0:
        raise UserError(
            f"{owner}: weights_file {path} matches none of the network's {len(wanted)} tensors: its keys "
            f"({_first(list(in_file))}) are not the network's ({_first(wanted)}); a file of another "
            "architecture, or its keys under another prefix?"
        )
    what = f"{matched} of the network's {len(wanted)} tensors (the head apart) matched"
    lacks = f"; missing from the file: {len(missing)} ({_first(missing)})" if missing else ""
    extra = (
        f"; in the file but not the network: {len(unexpected)} ({_first(unexpected)})" if unexpected else ""
    )
    if allow_partial:
        warn(f"{owner}: weights_file {path}: {what}, loaded (allow_partial){lacks}{extra}")
        return
    raise UserError(
        f"{owner}: weights_file {path} does not match the network: {what}{lacks}{extra}. A file of another "
        "architecture (a resnet34 file for a resnet18)? To load the matching tensors anyway, set "
        "allow_partial: true (--model.net.init_args.allow_partial true)"
    )


def shape_mismatches(
    network: Mapping[str, Any], in_file: Mapping[str, tuple[int, ...]], path: Path, owner: str
) -> UserError:
    """The one line for a weights file whose tensors have other shapes than the network's."""
    differ = [
        f"{k} {in_file[k]} in the file, {tuple(v.shape)} in the network"
        for k, v in network.items()
        if k in in_file and tuple(v.shape) != in_file[k]
    ]
    return UserError(
        f"{owner}: weights_file {path} does not fit the network: {len(differ)} tensor(s) of other shapes "
        f"({'; '.join(differ[:SHOWN])}{'; ...' if len(differ) > SHOWN else ''}): a file of another architecture "
        "or width?"
    )


def _needs_safetensors(owner: str) -> None:
    if importlib.util.find_spec("safetensors") is None:
        raise UserError(
            f"{owner}: reading a .safetensors weights_file needs safetensors: pip install safetensors"
        )


def _not_weights(path: Path, owner: str, reason: str) -> UserError:
    return UserError(
        f"{owner}: weights_file {path} is not a readable weights file (a .safetensors file or a torch.save'd "
        f"state dict): {reason}"
    )


def _first(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:200]
