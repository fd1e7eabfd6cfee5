"""How `python -m project prepare` writes the chunks: each split of a source through litdata's `optimize`, in
working folders of its own, checked complete before the metadata (written last) is made.

Each sample is the image as JPEG bytes, its shorter side resized to `size`, its target and its index in the
split. litdata's worker processes end with a failure, and a disk that fills up is named as such, whatever
litdata raised instead.
"""

import errno
import json
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.data.datamodule import LabelledSplits
from project.errors import UserError
from project.streaming.metadata import FORMAT, METADATA
from project.streaming.prepare_bucket import Bucket
from project.streaming.prepare_sources import encode_sample, mean_std


@dataclass(frozen=True)
class ChunkSettings:
    """How samples are stored: the shorter side (None: the source's own), the JPEG quality, the bytes per
    chunk, and litdata's worker processes (None: one per available CPU)."""

    size: int | None
    quality: int
    chunk_bytes: int
    num_workers: int | None


@dataclass(frozen=True)
class ChunkOutput:
    """Where the chunks go: `root` (a local folder or the bucket's URL), `shown` (how messages name the output),
    and the bucket when it is object storage."""

    root: str
    shown: str
    bucket: Bucket | None = None


def write_splits(
    litdata: Any,
    source: LabelledSplits,
    fold_sizes: list[int] | None,
    output: ChunkOutput,
    chunks: ChunkSettings,
) -> dict[str, Any]:
    """Write every split of `source` to `output` and return the metadata to write last."""
    from project.machine import available_cpus

    workers = chunks.num_workers or available_cpus()
    counts: dict[str, int] = {}
    with _own_litdata_folders():
        for split, (files, labels) in source.splits.items():
            counts[split] = _write_split(litdata, split, files, labels, source, output, chunks, workers)
    stats_size = min(chunks.size or 256, source.image_size)
    mean, std = mean_std(source.splits["train"][0], stats_size, source.max_pixels)
    return {
        "format": FORMAT,
        "classes": source.classes,
        "targets": source.targets.kind,
        "splits": counts,
        # Fold k of the training split is its samples sum(sizes[:k]) to sum(sizes[:k + 1]).
        "folds": None if fold_sizes is None else {"seed": source.seed, "sizes": fold_sizes},
        "size": chunks.size,
        "mean": mean,
        "std": std,
        "source": source.name,
    }


def _write_split(
    litdata: Any,
    split: str,
    files: list[Any],
    labels: list[Any],
    source: LabelledSplits,
    output: ChunkOutput,
    chunks: ChunkSettings,
    workers: int,
) -> int:
    """Write one split to `output` with litdata, checked complete; the number of images written."""
    items = [
        (f, source.targets.stored(y), chunks.size, chunks.quality, source.max_pixels, i)
        for i, (f, y) in enumerate(zip(files, labels, strict=True))
    ]
    working = output.root if output.bucket is None else _litdata_cache()
    with _ending_children(), _full_disk_named(working, chunks.chunk_bytes):
        litdata.optimize(
            fn=encode_sample,
            inputs=items,
            output_dir=f"{output.root}/{split}",
            chunk_bytes=chunks.chunk_bytes,
            num_workers=min(workers, max(1, len(items))),
            mode="overwrite",
            verbose=False,
        )
    _check_complete(output.root, output.shown, split, output.bucket)
    return len(items)


#: The variables naming litdata's working folders (chunks waiting for upload, downloaded inputs).
LITDATA_FOLDERS = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")


@contextmanager
def _own_litdata_folders() -> Iterator[None]:
    """litdata's working folders for this prepare alone, removed after it. By default every `optimize` on the
    machine shares them (in the system's temporary folder) and empties them when it starts: a second prepare,
    into any folder, would delete the chunks a first one has not uploaded yet."""
    saved = {name: os.environ.get(name) for name in LITDATA_FOLDERS}
    folder = tempfile.mkdtemp(prefix=".prepare-litdata-")
    for name, sub in zip(LITDATA_FOLDERS, ("chunks", "data"), strict=True):
        os.environ[name] = os.path.join(folder, sub)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)


def _litdata_cache() -> str:
    """The local folder litdata writes chunks to before uploading them to object storage."""
    from litdata.processing.data_processor import _get_cache_dir  # pyright: ignore[reportPrivateUsage]

    return _get_cache_dir()


@contextmanager
def _full_disk_named(folder: str, chunk_bytes: int) -> Iterator[None]:
    """An error of litdata's while it writes into `folder` on a disk left with less room than a chunk, as the
    OSError it began as: its writer processes can fail on a full disk without saying so, and what then raises
    (an empty index file read back, say) names something else."""
    try:
        yield
    except Exception as e:
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            raise e from None
        if free >= chunk_bytes + (1 << 20) or isinstance(e, OSError):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from e


def metadata_text(metadata: dict[str, Any]) -> str:
    return json.dumps(metadata, indent=2) + "\n"


def _check_complete(root: str, shown: str, split: str, bucket: Bucket | None) -> None:
    """A UserError (and no metadata written) when `split`'s index under `root` lists no chunk, or a chunk that
    is not there: litdata's writer or uploader processes can fail without `optimize` raising."""
    try:
        text = bucket.read_index(split) if bucket else (Path(root) / split / "index.json").read_text()
        names = [chunk["filename"] for chunk in json.loads(text)["chunks"]]
    except Exception as e:  # no index at all: the split was not written
        raise UserError(f"prepare of {shown}/{split} did not finish ({type(e).__name__}: {e})") from None
    if not names:
        raise UserError(
            f"prepare of {shown}/{split} did not finish: its index lists no chunk; {METADATA} was not written, "
            "run prepare again"
        )
    if bucket is not None:
        missing = bucket.chunks_missing(split, names)
    else:
        missing = [n for n in names if not (Path(root) / split / n).is_file()]
    if missing:
        raise UserError(
            f"prepare of {shown}/{split} did not finish: {len(missing)} of its {len(names)} chunks are missing "
            f"({missing[0]}, ...); {METADATA} was not written, run prepare again"
        )


@contextmanager
def _ending_children() -> Iterator[None]:
    """On any failure (an error, SIGTERM, Ctrl-C), the worker processes started in the block end with it
    instead of spinning on after this process has gone."""
    before = set(multiprocessing.active_children())
    try:
        yield
    except BaseException:
        started = [p for p in multiprocessing.active_children() if p not in before]
        for process in started:
            process.terminate()
        for process in started:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        raise
