"""Finding and decoding image files: class-folder scans, any size and mode in, fixed-size RGB out."""

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from project.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def list_images(folder: Path) -> list[Path]:
    """Image files under `folder` (recursively), sorted; other files and hidden folders are skipped."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found += [
            Path(dirpath, f)
            for f in filenames
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")
        ]
    return sorted(found)


def scan_class_folders(
    folder: Path, classes: list[str] | None = None
) -> tuple[list[Path], list[int], list[str]]:
    """`folder/<class>/**/<image>` -> (files, labels, class names). Errors name the folder at fault.

    Args:
        folder: Directory with one sub-folder per class.
        classes: Expected class names (those of the training split), so val/test labels line up.
    """
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist or is not a directory")
    found = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not found:
        raise UserError(
            f"data folder {folder} has no class sub-folders; expected {folder}/<class name>/<images>"
        )
    if classes is not None and found != classes:
        raise UserError(
            f"class folders of {folder} ({', '.join(found)}) differ from the training classes ({', '.join(classes)})"
        )
    files, labels = [], []
    for label, name in enumerate(found):
        images = list_images(folder / name)
        if not images:
            raise UserError(
                f"class folder {folder / name} contains no images (looked for {', '.join(IMAGE_EXTENSIONS)})"
            )
        files += images
        labels += [label] * len(images)
    return files, labels, found


BAD_IMAGE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError)


def decode_image(path: Path, size: int) -> np.ndarray:
    """Decode any image as RGB, resize its shorter side to `size` and centre-crop: (size, size, 3) uint8.

    Grayscale, RGBA and palette images are converted (alpha is dropped). Raises one of BAD_IMAGE_ERRORS
    for a file that is not a readable image (corrupt, truncated, empty).
    """
    with Image.open(path) as im:
        im.draft("RGB", (size, size))  # JPEG: decode at a reduced scale directly, much faster
        if im.mode.startswith("I") or im.mode == "F":
            im = _high_depth_to_8bit(im)  # PIL's convert("RGB") would clip 16-bit grayscale to white
        if im.mode == "P":
            im = im.convert("RGBA")  # palette transparency must go through RGBA
        im = im.convert("RGB")
        w, h = im.size
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        im = im.resize((nw, nh), Image.Resampling.BILINEAR)
        left, top = (nw - size) // 2, (nh - size) // 2
        return np.array(im.crop((left, top, left + size, top + size)))


def _high_depth_to_8bit(im: Image.Image) -> Image.Image:
    """16/32-bit integer grayscale (16-bit PNG/TIFF: modes I;16*, I) scaled from the 16-bit range, and float
    grayscale (F) from [0, 1] (or clipped to [0, 255] when its values exceed 1), to 8-bit L."""
    a = np.asarray(im, dtype=np.float64)
    if im.mode != "F":
        a = a / 257.0  # 0..65535 -> 0..255
    elif a.size and np.nanmax(a) <= 1.0:
        a = a * 255.0
    return Image.fromarray(np.clip(np.nan_to_num(np.rint(a)), 0, 255).astype(np.uint8), "L")


def load_image(path: Path, size: int) -> np.ndarray:
    """`decode_image`, with a UserError naming the file when it cannot be read."""
    try:
        return decode_image(path, size)
    except BAD_IMAGE_ERRORS as e:
        raise UserError(f"cannot read image {path}: {e or type(e).__name__}") from None


def check_image(path: Path) -> str | None:
    """Cheap header check (no full decode): the reason `path` is not an image, or None."""
    try:
        with Image.open(path) as im:
            im.verify()
        return None
    except Exception as e:  # PIL raises many types for bad files
        return f"{type(e).__name__}: {e}"


class ImageFileDataset(Dataset):
    """Decodes one image per `__getitem__`: the path for datasets too large to cache, and for prediction.

    Yields (uint8 (3, size, size) tensor, target); the target is the label, or the index when `labels`
    is None (prediction).
    """

    def __init__(self, files: list[Path], labels: list[int] | None, size: int) -> None:
        self.files, self.labels, self.size = files, labels, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = torch.from_numpy(load_image(self.files[i], self.size)).permute(2, 0, 1).contiguous()
        return image, (self.labels[i] if self.labels is not None else i)


class DecodeAll(Dataset):
    """Decodes image i into (i, array or None, error or None): never raises, so one pass finds every bad file."""

    def __init__(self, files: list[Path], size: int) -> None:
        self.files, self.size = files, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray | None, str | None]:
        try:
            return i, decode_image(self.files[i], self.size), None
        except BAD_IMAGE_ERRORS as e:
            return i, None, str(e) or type(e).__name__
