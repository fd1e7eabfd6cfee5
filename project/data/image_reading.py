"""Finding and decoding image files: class-folder scans, any size and mode in, fixed-size RGB out."""

import os
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from project.data.label_checks import data_warning, nfc
from project.data.targets import Label
from project.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


class LabelledFiles(NamedTuple):
    """Image files with their labels, as a data source lists them (a scan of class folders, a CSV): files
    (absolute paths, as strings: a Path per file would cost more than the scan) and labels in order (of the
    source's kind of target, `project.data.targets`), the class (or tag, or value) names, each file's (size,
    modification time) as the scan saw them, which the image cache is keyed
    by, and `source_key`: whatever else the cache is keyed by (a hash of the CSV the labels come from)."""

    files: list[str]
    labels: list[Label]
    classes: list[str]
    stamps: list[tuple[int, int]]
    source_key: str = ""


def list_images(folder: Path) -> list[Path]:
    """Image files under `folder` (recursively), sorted; other files and hidden entries are skipped."""
    found: list[str] = []
    _scan(str(folder), found, None)
    return [Path(f) for f in found]


def _scan(
    folder: str,
    found: list[str],
    stamps: list[tuple[int, int]] | None,
    seen: set[tuple[int, int]] | None = None,
) -> None:
    """One `os.scandir` pass, depth-first in name order (the order of sorted paths): each image file is
    appended to `found` and, when `stamps` is given, stat'ed once for its (size, mtime in ns).

    Symbolic links are followed; one that leads back into a folder already being scanned (a loop) is a
    UserError naming it, as is an entry that cannot be read."""
    seen = set() if seen is None else seen
    try:
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            raise UserError(
                f"{folder} leads back to a folder it is inside (a loop of symbolic links): remove the link on "
                "that path, or replace it with the images it should point to"
            )
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        seen = seen | {(st.st_dev, st.st_ino)}
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                _scan(entry.path, found, stamps, seen)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS):
                if stamps is not None:
                    st = entry.stat()
                    stamps.append((st.st_size, st.st_mtime_ns))
                found.append(entry.path)
    except OSError as e:
        raise UserError(f"cannot read {e.filename or folder}: {e.strerror or e}") from None


def scan_class_folders(folder: Path, classes: list[str] | None = None) -> LabelledFiles:
    """`folder/<class>/**/<image>` -> files, labels and class names. Errors name the folder at fault.

    Args:
        folder: Directory with one sub-folder per class.
        classes: Expected class names (those of the training split), so val/test labels line up.
    """
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist or is not a directory")
    folder = folder.resolve()  # once: the cache key uses these absolute paths
    # A class is its name in Unicode's composed form: a folder copied from a Mac may spell it decomposed.
    folders: dict[str, list[str]] = {}
    for d in sorted(folder.iterdir()):
        if d.is_dir() and not d.name.startswith("."):
            folders.setdefault(nfc(d.name), []).append(d.name)
    found = sorted(folders)
    if written_twice := next((names for names in folders.values() if len(names) > 1), None):
        data_warning(
            f"class folders {' and '.join(map(ascii, written_twice))} of {folder} are one name in two Unicode "
            f"forms, which print alike ({nfc(written_twice[0])}): their images are one class"
        )
    by_case: dict[str, list[str]] = {}
    for name in found:
        by_case.setdefault(name.casefold(), []).append(name)
    if clash := next((names for names in by_case.values() if len(names) > 1), None):
        raise UserError(
            f"class folders {' and '.join(clash)} of {folder} differ only in case: they would be two classes here "
            "and one on a case-insensitive file system (macOS, Windows); merge them or rename one"
        )
    if not found:
        raise UserError(
            f"data folder {folder} has no class sub-folders; expected {folder}/<class name>/<images>"
        )
    if classes is None and len(found) < 2:
        raise UserError(
            f"data folder {folder} has one class folder ({found[0]}): a classifier needs at least two, one "
            f"folder of images per class ({folder}/<class name>/<images>)"
        )
    if classes is not None and found != classes:
        raise UserError(
            f"class folders of {folder} ({', '.join(found)}) differ from the training classes ({', '.join(classes)})"
        )
    scan = LabelledFiles([], [], found, [])
    for label, name in enumerate(found):
        before = len(scan.files)
        for written in folders[name]:
            _scan(str(folder / written), scan.files, scan.stamps)
        if len(scan.files) == before:
            raise UserError(
                f"class folder {folder / folders[name][0]} contains no images (looked for "
                f"{', '.join(IMAGE_EXTENSIONS)})"
            )
        scan.labels.extend([label] * (len(scan.files) - before))
    return scan


#: Largest width x height decoded by default: a 40-megapixel photo passes, a decompression bomb (a few KB
#: of PNG that declare 20000 x 20000 pixels, gigabytes once decoded) does not.
MAX_IMAGE_PIXELS = 40_000_000


class ImageTooLarge(ValueError):
    """An image that declares more pixels than the limit: refused before it is decoded."""


BAD_IMAGE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError)


def open_image(source: str | Path | IO[bytes], max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """`PIL.Image.open` (which reads the header only) with the decompression-bomb guard every reader of images
    in the template goes through: training, prediction, ONNX prediction and serving.

    Raises ImageTooLarge (one of BAD_IMAGE_ERRORS) naming the pixel count when the image declares more than
    `max_pixels`. PIL's own guard raises `DecompressionBombError`, which is no OSError, above twice its
    `MAX_IMAGE_PIXELS`, and only warns below that; both become ImageTooLarge here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged below, against max_pixels
        try:
            image = Image.open(source)
        except Image.DecompressionBombError as e:
            declared = re.search(r"\((\d+) pixels\)", str(e))
            pixels = f"{int(declared.group(1)):,} pixels" if declared else "more pixels than PIL allows"
            raise ImageTooLarge(
                f"the image declares {pixels}, more than the limit of {max_pixels:,}"
            ) from None
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise ImageTooLarge(
            f"the image declares {width}x{height} = {width * height:,} pixels, more than the limit of {max_pixels:,}"
        )
    return image


def decode_image(path: str | Path | IO[bytes], size: int, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Decode any image as RGB, resize its shorter side to `size` and centre-crop: (size, size, 3) uint8.

    Grayscale, RGBA and palette images are converted (alpha is dropped). Raises one of BAD_IMAGE_ERRORS
    for a file that is not a readable image (corrupt, truncated, empty, or a decompression bomb).
    """
    with open_image(path, max_pixels) as im:
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


def load_image(path: Path, size: int, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """`decode_image`, with a UserError naming the file when it cannot be read."""
    try:
        return decode_image(path, size, max_pixels)
    except BAD_IMAGE_ERRORS as e:
        raise UserError(f"cannot read image {path}: {e or type(e).__name__}") from None


def check_image(path: Path, max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Cheap header check (no full decode): the reason `path` is not an image, or None."""
    try:
        with open_image(path, max_pixels) as im:
            im.verify()
        return None
    except Exception as e:  # PIL raises many types for bad files
        return f"{type(e).__name__}: {e}"


class ImageFileDataset(Dataset):
    """Decodes one image per `__getitem__`: the path for datasets too large to cache, and for prediction.

    Yields (uint8 (3, size, size) tensor, target); the target is the label (a row of `labels`: an int, or
    for a tensor of targets its row, such as a float32 multi-hot vector), or the index when `labels` is None
    (prediction). `transform`, if given, augments each uint8 image (in the loader workers).
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        labels: Sequence[int] | torch.Tensor | None,
        size: int,
        max_pixels: int = MAX_IMAGE_PIXELS,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.files, self.labels, self.size, self.max_pixels = (
            [Path(f) for f in files],
            labels,
            size,
            max_pixels,
        )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        image = (
            torch.from_numpy(load_image(self.files[i], self.size, self.max_pixels))
            .permute(2, 0, 1)
            .contiguous()
        )
        if self.transform is not None:  # per-image augmentation (TrivialAugmentWide), drawn in the worker
            image = self.transform(image)
        return image, (self.labels[i] if self.labels is not None else i)


class DecodeAll(Dataset):
    """Decodes image i into (i, array or None, error or None): never raises, so one pass finds every bad file."""

    def __init__(self, files: Sequence[str | Path], size: int, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        self.files, self.size, self.max_pixels = files, size, max_pixels

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray | None, str | None]:
        try:
            return i, decode_image(self.files[i], self.size, self.max_pixels), None
        except BAD_IMAGE_ERRORS as e:
            return i, None, str(e) or type(e).__name__
