"""`python -m project prepare`: an image dataset (class folders, CSV, multi-label CSV, CIFAR) converted into
litdata's chunked format, for `StreamingImageDataModule` to stream from a local folder or object storage.

Every split (train, val, test) becomes one optimized litdata dataset in its own sub-folder of the output:
each sample is the image as JPEG bytes, its shorter side resized to `size` (the source resolution the
loader's crop starts from), its target (the class index, or a multi-hot uint8 row of tags) and its index in
the split. The class names, whether the data is multi-label, the splits with their sizes, the folds of the
training split and the training images' per-channel mean and std go into `streaming.json`, written last: it
marks the dataset complete, and marks the folder as one `prepare` made.

A prepare never removes what it did not write: a local output is written into a hidden staging folder beside it
and swapped in whole at the end, under a lock file (project.streaming.prepare_output); an s3:// output carries a
marker until the metadata is written last (project.streaming.prepare_bucket). The chunks themselves are written by
project.streaming.prepare_chunks.

litdata is an optional extra (`pip install -e ".[streaming]"`), imported only by prepare's modules and the
DataModule.
"""

import multiprocessing
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from project.atomic_files import stop_on_sigterm
from project.data.datamodule import LabelledSplits
from project.data.image_reading import MAX_IMAGE_PIXELS
from project.errors import UserError
from project.streaming.metadata import METADATA
from project.streaming.prepare_bucket import open_bucket
from project.streaming.prepare_chunks import ChunkOutput, ChunkSettings, metadata_text, write_splits
from project.streaming.prepare_output import (
    INCOMPLETE,
    check_apart,
    claim,
    fsync_tree,
    input_folders,
    local_state,
    locked,
    remove_stale_staging,
    swap_in,
    writing,
)
from project.streaming.prepare_sources import fold_order, read_source

SPLITS = ("train", "val", "test")
_CHUNK_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def require_litdata() -> Any:
    """The litdata module, or a UserError saying how to install it."""
    try:
        import litdata
    except ImportError:
        raise UserError(
            'streaming needs litdata, an optional extra: pip install -e ".[streaming]" (or pip install litdata)'
        ) from None
    return litdata


def chunk_size_bytes(chunk_bytes: str | int) -> int:
    """`--chunk_bytes` in bytes (`64MB`, `500KB`, `1000000`); a UserError unless it is at least one byte."""
    match = _CHUNK_SIZE.match(str(chunk_bytes))
    size = int(float(match[1]) * _UNITS[match[2].lower()]) if match else 0
    if size < 1:
        raise UserError(
            f"--chunk_bytes must be a size of at least 1 byte, such as 64MB, 500KB or 1000000, got {chunk_bytes!r}"
        )
    return size


@contextmanager
def _stop_on_sigterm(message: str) -> Iterator[None]:
    """`stop_on_sigterm` (one line, exit status 143, every `finally` run), except while a worker process is
    being started: one cut off there would print a traceback of its own, unseen by the cleanup. The signal
    then comes again a moment later."""
    with stop_on_sigterm(message):
        stop = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is not threading.main_thread() or not callable(stop):
            yield  # no handler can be installed here
            return

        def stop_unless_starting(signum: int, frame: Any) -> None:
            if _starting_a_process(frame):
                again = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM))
                again.daemon = True
                again.start()
                return
            stop(signum, frame)

        signal.signal(signal.SIGTERM, stop_unless_starting)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, stop)


def _starting_a_process(frame: Any) -> bool:
    """Whether the stack of `frame` is inside multiprocessing's Process.start."""
    package = os.path.dirname(multiprocessing.__file__)
    while frame is not None:
        if frame.f_code.co_name == "start" and frame.f_code.co_filename.startswith(package):
            return True
        frame = frame.f_back
    return False


def prepare(
    output_dir: str,
    size: int | None = 256,
    quality: int = 90,
    chunk_bytes: str = "64MB",
    num_workers: int | None = None,
    num_folds: int | None = 5,
    overwrite: bool = False,
    fit_args: list[str] | None = None,
) -> dict[str, Any]:
    """Convert the image dataset of a config (class folders, CSV, multi-label CSV, CIFAR) into litdata's chunked
    format, one optimized dataset per split, for `StreamingImageDataModule` (configs/streaming.yaml).

    The splits are the data's own (train, and val/test where it has them); without a validation split, the
    DataModule's own stratified, seeded validation split (`val_fraction`, CIFAR's `val_size`) is stored as
    `val`. Unreadable images are an error naming them (or left out with data.skip_corrupt). `streaming.json`,
    written last, holds the class names, the splits, the folds and the training images' mean and std. A local
    output is written beside it and swapped in whole: a failed or stopped prepare leaves it as it was.

    Args:
        output_dir: Where the prepared dataset goes: a new or empty local folder (created), or an s3:// URL (a
            bucket and prefix; the endpoint of an S3-compatible server from AWS_ENDPOINT_URL). Never a folder
            that is, contains or lies inside the input.
        size: Shorter side of the stored images, in pixels (never enlarged); null keeps the source resolution.
        quality: JPEG quality of re-encoded images (1-95).
        chunk_bytes: Size of litdata's chunks (the unit each worker downloads and reads), e.g. 64MB.
        num_workers: Parallel encoding processes; default: one per available CPU.
        num_folds: Stratified folds of the training split recorded for `python -m project cv` (seeded by the
            source's data.seed; the split of `cv` must have as many); null records none.
        overwrite: Replace a dataset prepare made in output_dir, all at once when the new one is complete (a
            folder holding anything else is refused all the same).
        fit_args: The `--config` file(s) and `--data.*` flags that name the source, read as `fit` reads them
            (e.g. --config configs/folder.yaml --data.root path/to/images).
    """
    from project.cli.config import parse_fit_args

    litdata = require_litdata()
    if size is not None and size < 1:
        raise UserError(f"--size must be at least 1 pixel (or null for the source resolution), got {size}")
    if not 1 <= quality <= 95:
        raise UserError(f"--quality must be between 1 and 95, got {quality}")
    settings = ChunkSettings(size, quality, chunk_size_bytes(chunk_bytes), num_workers)
    _, parsed = parse_fit_args(fit_args or [])
    if "://" in output_dir:
        bucket = open_bucket(output_dir)
        claim(bucket.state(), bucket.shown, overwrite)
        source = _read_source(parsed, num_folds)
        stopped = (
            f"error: stopped by SIGTERM; {bucket.shown} holds no complete dataset now ({METADATA} is written "
            "last): prepare it again"
        )
        with _stop_on_sigterm(stopped), writing(bucket.shown, bucket.url):
            bucket.put(INCOMPLETE, "")  # before the old metadata goes: the prefix stays recognisably ours
            bucket.delete(METADATA)
            metadata = write_splits(litdata, *source, ChunkOutput(bucket.url, bucket.shown, bucket), settings)
            bucket.put(METADATA, metadata_text(metadata))
            bucket.delete(INCOMPLETE)
        shown = bucket.shown
    else:
        out = Path(output_dir).expanduser().absolute()
        shown = str(out)
        check_apart(out, input_folders(parsed.data))  # before anything is read
        claim(local_state(out), shown, overwrite)
        with _stop_on_sigterm(f"error: stopped by SIGTERM; prepare left --output_dir {out} as it was"):
            metadata = _prepare_folder(litdata, parsed, out, overwrite, num_folds, settings)
    splits = ", ".join(f"{s}: {n} images" for s, n in metadata["splits"].items())
    print(f"prepared {splits} in {shown}")
    return metadata


def _read_source(parsed: Any, num_folds: int | None) -> tuple[LabelledSplits, list[int] | None]:
    """The source's splits (its training split in fold order) and the sizes of its folds."""
    from project.cli.config import build_datamodule

    source = read_source(build_datamodule(parsed))
    order, fold_sizes = fold_order(source, num_folds)
    files, labels = source.splits["train"]
    source.splits["train"] = ([files[i] for i in order], [labels[i] for i in order])
    return source, fold_sizes


def _prepare_folder(
    litdata: Any, parsed: Any, out: Path, overwrite: bool, num_folds: int | None, settings: ChunkSettings
) -> dict[str, Any]:
    """Write the dataset into a staging folder beside `out` and swap it in, under the lock; a failure removes
    the staging folder, the lock and the parent folders this call created."""
    shown = str(out)
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        with writing(shown):
            out.parent.mkdir(parents=True, exist_ok=True)
        with locked(out, shown):
            claim(local_state(out), shown, overwrite)  # again, now that no other prepare can change it
            remove_stale_staging(out)
            source, fold_sizes = _read_source(parsed, num_folds)
            staging = out.with_name(f".{out.name}.prepare-{os.getpid()}")
            try:
                with writing(shown):
                    shutil.rmtree(staging, ignore_errors=True)
                    staging.mkdir()
                    (staging / INCOMPLETE).touch()
                    output = ChunkOutput(str(staging), shown)
                    metadata = write_splits(litdata, source, fold_sizes, output, settings)
                    (staging / METADATA).write_text(metadata_text(metadata))
                    (staging / INCOMPLETE).unlink()
                    fsync_tree(staging)
                    swap_in(staging, out)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # gone already, unless this failed
    except BaseException:
        for folder in created:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return metadata


def parse_args(args: list[str]) -> dict[str, Any]:
    """The keyword arguments of `prepare` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(prepare, args, prog="python -m project prepare")


def main(args: list[str]) -> None:
    prepare(**parse_args(args))


__all__ = ["MAX_IMAGE_PIXELS", "METADATA", "prepare"]
