"""What a consumer of an exported model must do to an image before the network sees it.

Training normalises batches inside the DataModule, so an exported network expects normalised float input.
`Preprocessing` carries the facts (input size, mean, std, class names, and the decoded square and centre
crop evaluation used) from the checkpoint into the JSON beside every export, and applies them exactly as
training's evaluation did: the same decode (any size and mode -> RGB, shorter side resized, centre square),
the same crop and resize (`evaluation_view`) and the same normalisation function.
"""

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from project.data.augment import evaluation_view, normalize
from project.data.image_reading import MAX_IMAGE_PIXELS, decode_image
from project.errors import UserError


@dataclass(frozen=True)
class Preprocessing:
    """Input facts of a trained classifier.

    Args:
        input_shape: (channels, height, width) of one network input; height == width.
        mean: Per-channel mean in [0, 1] units, subtracted after scaling pixels to [0, 1].
        std: Per-channel standard deviation, divided by after subtracting the mean.
        class_names: One name per output logit, in label order.
        source_size: Side of the square each image is decoded to first (the DataModule's cache or decode
            size); None: the input's own.
        eval_crop: The central share of each side of that square kept before resizing it to the input.
    """

    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]
    source_size: int | None = None
    eval_crop: float = 1.0

    def __post_init__(self) -> None:
        channels, height, width = self.input_shape
        if height != width:
            raise UserError(f"only square inputs are supported, got input_shape {self.input_shape}")
        if not len(self.mean) == len(self.std) == channels:
            raise UserError(
                f"mean {self.mean} and std {self.std} must have one value per channel ({channels})"
            )

    @property
    def image_size(self) -> int:
        return self.input_shape[1]

    @property
    def decode_size(self) -> int:
        """Side of the square an image is decoded to before `to_input`."""
        return self.source_size or self.image_size

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_input(self, images: Tensor) -> Tensor:
        """uint8 (B, C, decode_size, decode_size) -> (B, C, H, W) at the input size, as evaluation made it:
        unchanged uint8 when it is that size already, else float in [0, 255]."""
        return evaluation_view(images, self.eval_crop, (self.input_shape[1], self.input_shape[2]))

    def normalize(self, images: Tensor) -> Tensor:
        """uint8 (B, C, H, W) -> float32 network input, exactly as the DataModule does it."""
        return normalize(images, torch.tensor(self.mean), torch.tensor(self.std))

    def decode(self, source: str | Path | bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Tensor:
        """An image file (path or raw bytes) of any size and mode -> (C, H, W) at the input size (`to_input`).

        Raises one of `project.data.image_reading.BAD_IMAGE_ERRORS` for data that is not an image, or an image of
        more than `max_pixels` pixels (ImageTooLarge).
        """
        file = io.BytesIO(source) if isinstance(source, bytes) else source
        square = torch.from_numpy(np.ascontiguousarray(decode_image(file, self.decode_size, max_pixels)))
        return self.to_input(square.permute(2, 0, 1)[None])[0]

    def steps(self) -> str:
        """`decode` and `normalize` in words, for a consumer outside Python."""
        size, (_, height, width) = self.decode_size, self.input_shape
        crop = f"keep the central {self.eval_crop:g} of each side; " if self.eval_crop < 1 else ""
        resize = (
            f"{crop}resize to {height} x {width} (bilinear, antialiased); " if crop or size != height else ""
        )
        return (
            f"decode as RGB; resize the shorter side to {size} (bilinear); centre-crop to {size} x {size}; "
            f"{resize}scale to [0, 1]; subtract mean and divide by std per channel"
        )

    # -- the JSON beside an export ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "preprocessing") -> "Preprocessing":
        missing = [k for k in ("input_shape", "mean", "std", "class_names") if k not in d]
        if missing:
            raise UserError(f"{source} lacks {', '.join(missing)}")
        channels, height, width = (int(v) for v in d["input_shape"])
        return cls(
            input_shape=(channels, height, width),
            mean=tuple(float(v) for v in d["mean"]),
            std=tuple(float(v) for v in d["std"]),
            class_names=tuple(str(v) for v in d["class_names"]),
            # absent from exports and checkpoints written before evaluation could crop: the whole image
            source_size=None if d.get("source_size") is None else int(d["source_size"]),
            eval_crop=float(d.get("eval_crop", 1.0)),
        )


def metadata_path(model_path: str | Path) -> Path:
    """The JSON that travels with an exported model: `model.onnx` -> `model.json`."""
    model_path = Path(model_path)
    return model_path.with_name(model_path.name.split(".")[0] + ".json")


def read_metadata(model_path: str | Path) -> tuple[dict[str, Any], Preprocessing]:
    """(the whole JSON, its preprocessing) of an exported model; UserError naming the file at fault."""
    path = metadata_path(model_path)
    if not Path(model_path).is_file():
        raise UserError(f"model file {model_path} does not exist")
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: an exported model needs the JSON written beside it by "
            "`python -m project export` (input size, mean/std, class names)"
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} must hold a JSON object")
    return meta, Preprocessing.from_dict(meta.get("preprocessing", {}), source=str(path))
