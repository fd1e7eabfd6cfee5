"""`python -m project prepare`: an image-file dataset (class folders, CSV, multi-label CSV) converted into
litdata's chunked format, for `StreamingImageDataModule` to stream from a local folder or object storage.

Every split (train, val, test) becomes one optimized litdata dataset in its own sub-folder of the output:
each sample is the image as JPEG bytes, its shorter side resized to `size` (the source resolution the
loader's crop starts from), and its target (the class index, or a multi-hot uint8 row of tags). The
class names, whether the data is multi-label, the splits with their sizes and the training images'
per-channel mean and std go into `streaming.json`, written last and atomically: a folder without it is an
interrupted prepare, which the DataModule refuses and a new prepare overwrites.

litdata is an optional extra (`pip install -e ".[streaming]"`), imported only here and in the DataModule.
"""

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from project.atomic_files import atomic_write_text
from project.data.image_cache import drop_bad
from project.data.images import MAX_IMAGE_PIXELS, _high_depth_to_8bit, check_image, decode_image, open_image
from project.errors import UserError

#: The metadata file of a prepared dataset; its presence marks the dataset complete.
METADATA = "streaming.json"
#: The version of the sample layout and metadata this module writes (and the DataModule reads).
FORMAT = 1
SPLITS = ("train", "val", "test")
#: Training images the mean and std are computed over (an even spread of the split), at most.
STATS_SAMPLES = 2000


def require_litdata() -> Any:
    """The litdata module, or a UserError saying how to install it."""
    try:
        import litdata
    except ImportError:
        raise UserError(
            'streaming needs litdata, an optional extra: pip install -e ".[streaming]" (or pip install litdata)'
        ) from None
    return litdata


def encode_sample(item: tuple[str, Any, int | None, int, int, int]) -> dict[str, Any]:
    """One sample of the optimized dataset: `item` is (image path, target, size, JPEG quality, max pixels,
    index in the split).

    The image is converted to RGB and, when `size` is set, its shorter side resized to `size` (never
    enlarged); a JPEG source kept at its own resolution is stored as it is, without re-encoding."""
    path, target, size, quality, max_pixels, index = item
    with open_image(path, max_pixels) as im:
        is_jpeg = im.format == "JPEG" and im.mode == "RGB"
        w, h = im.size
        if is_jpeg and (size is None or min(w, h) <= size):
            data = Path(path).read_bytes()
        else:
            side = min(w, h) if size is None else min(size, min(w, h))
            rgb = _resize_shorter(path, side, max_pixels)
            buffer = io.BytesIO()
            Image.fromarray(rgb).save(buffer, format="JPEG", quality=quality)
            data = buffer.getvalue()
    return {"image": data, "target": target, "index": index}


def _resize_shorter(path: str, side: int, max_pixels: int) -> np.ndarray:
    """The image as RGB with its shorter side resized to `side`, the aspect ratio kept (no crop)."""
    with open_image(path, max_pixels) as im:
        if im.mode.startswith("I") or im.mode == "F":
            im = _high_depth_to_8bit(im)
        if im.mode == "P":
            im = im.convert("RGBA")
        im = im.convert("RGB")
        w, h = im.size
        scale = side / min(w, h)
        im = im.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.Resampling.BILINEAR)
        return np.asarray(im)


def _target(label: Any, num_classes: int, multilabel: bool) -> Any:
    if not multilabel:
        return int(label)
    row = np.zeros(num_classes, dtype=np.uint8)
    row[list(label)] = 1
    return row


def _mean_std(files: list[str], size: int, max_pixels: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in [0, 1] over an even spread of at most STATS_SAMPLES of `files`, decoded at
    `size` (the statistics of what the network will see, up to the crop)."""
    step = max(1, len(files) // STATS_SAMPLES)
    total = np.zeros(3)
    squares = np.zeros(3)
    pixels = 0
    for path in files[::step][:STATS_SAMPLES]:
        image = decode_image(path, size, max_pixels).reshape(-1, 3).astype(np.float64) / 255.0
        total += image.sum(0)
        squares += (image**2).sum(0)
        pixels += len(image)
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 1e-12))
    return mean.tolist(), std.tolist()


def is_prepared(folder: Path) -> bool:
    return (folder / METADATA).is_file()


def prepare(
    output_dir: str,
    size: int | None = 256,
    quality: int = 90,
    chunk_bytes: str = "64MB",
    num_workers: int | None = None,
    overwrite: bool = False,
    fit_args: list[str] | None = None,
) -> dict[str, Any]:
    """Convert the image dataset of a config (class folders, CSV, multi-label CSV) into litdata's chunked
    format, one optimized dataset per split, for `StreamingImageDataModule` (configs/streaming.yaml).

    The splits are the data's own (train, and val/test where it has them); without a validation split, the
    DataModule's own stratified, seeded `val_fraction` split is stored as `val`. Unreadable images are an
    error naming them (or left out with data.skip_corrupt). `streaming.json`, written last, holds the class
    names, the splits and the training images' mean and std: until it exists the output is incomplete.

    Args:
        output_dir: Local folder for the prepared dataset (created; copy it to object storage as it is).
        size: Shorter side of the stored images, in pixels (never enlarged); null keeps the source resolution.
        quality: JPEG quality of re-encoded images (1-95).
        chunk_bytes: Size of litdata's chunks (the unit each worker downloads and reads).
        num_workers: Parallel encoding processes; default: one per available CPU.
        overwrite: Replace a dataset already prepared in output_dir (refused otherwise).
        fit_args: The `--config` file(s) and `--data.*` flags that name the source, read as `fit` reads them
            (e.g. --config configs/folder.yaml --data.root path/to/images).
    """
    from project.cli.config import build_datamodule, parse_fit_args
    from project.data.datamodule import available_cpus
    from project.data.image_files import ImageFilesDataModule

    litdata = require_litdata()
    if size is not None and size < 1:
        raise UserError(f"--size must be at least 1 pixel (or null for the source resolution), got {size}")
    if not 1 <= quality <= 95:
        raise UserError(f"--quality must be between 1 and 95, got {quality}")
    if "://" in output_dir:
        raise UserError(
            f"--output_dir {output_dir}: prepare writes a local folder; copy it to object storage as it is "
            "(e.g. aws s3 cp --recursive) and stream from there with --data.input_dir"
        )
    out = Path(output_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"--output_dir {out} is a file, not a folder")
    if is_prepared(out) and not overwrite:
        raise UserError(
            f"--output_dir {out} already holds a prepared dataset ({METADATA}); add --overwrite to replace it"
        )
    _, parsed = parse_fit_args(fit_args or [])
    data = build_datamodule(parsed)
    if not isinstance(data, ImageFilesDataModule):
        raise UserError(
            f"prepare converts image files (ImageFolderDataModule, ImageCSVDataModule); the config's data is "
            f"{type(data).__name__}"
        )
    (out / METADATA).unlink(missing_ok=True)  # an overwrite in progress is incomplete too
    workers = num_workers or available_cpus()
    classes, multilabel = data.class_names, data.multilabel
    max_pixels = data.max_image_pixels

    splits: dict[str, tuple[list[str], list[Any]]] = {}
    train = data.scanned("train")
    if data.has_split("val"):
        splits["train"] = (train.files, train.labels)
        val = data.scanned("val")
        splits["val"] = (val.files, val.labels)
    else:
        train_idx, val_idx = data._split()
        splits["train"] = ([train.files[i] for i in train_idx], [train.labels[i] for i in train_idx])
        splits["val"] = ([train.files[i] for i in val_idx], [train.labels[i] for i in val_idx])
    if data.has_split("test"):
        test = data.scanned("test")
        splits["test"] = (test.files, test.labels)

    counts: dict[str, int] = {}
    for split, (files, labels) in splits.items():
        bad = {i: reason for i, f in enumerate(files) if (reason := check_image(Path(f), max_pixels))}
        keep = drop_bad(list(range(len(files))), bad, files, data.skip_corrupt)
        files, labels = [files[i] for i in keep], [labels[i] for i in keep]
        splits[split] = (files, labels)
        target = out / split
        if target.exists():
            shutil.rmtree(target)  # a split of an interrupted (or replaced) prepare
        items = [
            (f, _target(y, len(classes), multilabel), size, quality, max_pixels, i)
            for i, (f, y) in enumerate(zip(files, labels, strict=True))
        ]
        litdata.optimize(
            fn=encode_sample,
            inputs=items,
            output_dir=str(target),
            chunk_bytes=chunk_bytes,
            num_workers=min(workers, max(1, len(items))),
            mode="overwrite",
            verbose=False,
        )
        counts[split] = len(items)

    stats_size = size or 256
    mean, std = _mean_std(splits["train"][0], min(stats_size, data.image_size), max_pixels)
    metadata = {
        "format": FORMAT,
        "classes": classes,
        "multilabel": multilabel,
        "splits": counts,
        "size": size,
        "mean": mean,
        "std": std,
        "source": type(data).__name__,
    }
    atomic_write_text(out / METADATA, json.dumps(metadata, indent=2) + "\n")
    print(f"prepared {', '.join(f'{s}: {n} images' for s, n in counts.items())} in {out}")
    return metadata


def parse_args(args: list[str]) -> dict[str, Any]:
    """The keyword arguments of `prepare` for a command line (checks it without running anything)."""
    from project.cli.config import parse_tool_args

    return parse_tool_args(prepare, args, prog="python -m project prepare")


def main(args: list[str]) -> None:
    prepare(**parse_args(args))


__all__ = ["MAX_IMAGE_PIXELS", "METADATA", "prepare"]
