"""`python -m project prepare`: an image dataset (class folders, CSV, multi-label CSV, CIFAR) converted into
litdata's chunked format, for `StreamingImageDataModule` to stream from a local folder or object storage.

Every split (train, val, test) becomes one optimized litdata dataset in its own sub-folder of the output:
each sample is the image as JPEG bytes, its shorter side resized to `size` (the source resolution the
loader's crop starts from), its target (the class index, or a multi-hot uint8 row of tags) and its index in
the split. The class names, whether the data is multi-label, the splits with their sizes, the folds of the
training split and the training images' per-channel mean and std go into `streaming.json`, written last: it
marks the dataset complete, and marks the folder as one `prepare` made.

A prepare never removes what it did not write. A local output is written into a hidden staging folder beside
it (`.NAME.prepare-<pid>`, holding the `.prepare-incomplete` marker) and swapped in whole at the end, under a
lock file beside it (`.NAME.prepare.lock`): a prepare that fails, or is stopped, leaves the output as it was,
and a second prepare into the same folder is refused while the first runs. Only a new or empty folder is
written, or, with --overwrite, a folder holding a dataset prepare made; never a folder that is, contains or
lies inside the input. An s3:// output (litdata uploads each chunk as it is written; the endpoint, e.g. of an
S3-compatible server, comes from AWS_ENDPOINT_URL like the credentials from the AWS variables) carries the
`.prepare-incomplete` key until `streaming.json` is written last; a prefix holding neither is never written.

litdata is an optional extra (`pip install -e ".[streaming]"`), imported only here and in the DataModule.
"""

import ctypes
import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from project.atomic_files import _alive, fsync_folder, no_space_left, stop_on_sigterm
from project.data.images import MAX_IMAGE_PIXELS
from project.data.prepare_sources import (
    SourceSplits,
    encode_sample,
    fold_order,
    mean_std,
    read_source,
)
from project.data.streaming_metadata import (
    FORMAT,
    METADATA,
    check_s3_endpoint,
    hide_password,
    refuse_url_credentials,
    shown_url,
)
from project.errors import UserError

SPLITS = ("train", "val", "test")
#: The file (in a local staging folder) or key (under an s3:// prefix) marking an unfinished prepare's output.
INCOMPLETE = ".prepare-incomplete"
#: The settings of a source naming folders it reads, and files whose folder it reads.
INPUT_FOLDERS = ("root", "images")
INPUT_FILES = ("csv", "val_csv", "test_csv")
_CHUNK_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
#: An OS error as a worker's traceback (which litdata raises as a RuntimeError) ends with it.
_OS_ERROR_LINE = re.compile(r"(?:\w+Error): \[Errno (\d+)\] ([^\n]*)")


def require_litdata() -> Any:
    """The litdata module, or a UserError saying how to install it."""
    try:
        import litdata
    except ImportError:
        raise UserError(
            'streaming needs litdata, an optional extra: pip install -e ".[streaming]" (or pip install litdata)'
        ) from None
    return litdata


def is_prepared(folder: Path) -> bool:
    return _is_own_metadata(folder / METADATA)


def _is_own_metadata(path: Path) -> bool:
    """Whether `path` is the metadata of a dataset this version of prepare made (valid JSON, its format)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def chunk_size_bytes(chunk_bytes: str | int) -> int:
    """`--chunk_bytes` in bytes (`64MB`, `500KB`, `1000000`); a UserError unless it is at least one byte."""
    match = _CHUNK_SIZE.match(str(chunk_bytes))
    size = int(float(match[1]) * _UNITS[match[2].lower()]) if match else 0
    if size < 1:
        raise UserError(
            f"--chunk_bytes must be a size of at least 1 byte, such as 64MB, 500KB or 1000000, got {chunk_bytes!r}"
        )
    return size


def input_folders(data_config: Any) -> dict[str, Path]:
    """The folders a source's config reads (what names each -> the folder, resolved): its own folders, those of
    its CSV files, and the folder torchvision reads CIFAR from inside data_dir."""
    settings = getattr(data_config, "init_args", None)
    if settings is None:
        return {}
    found: dict[str, Path] = {}
    for key in (*INPUT_FOLDERS, *INPUT_FILES):
        if value := settings.get(key):
            path = Path(str(value)).expanduser().resolve()
            found[f"data.{key}" if key in INPUT_FOLDERS else f"data.{key}'s folder"] = (
                path.parent if key in INPUT_FILES else path
            )
    if value := settings.get("data_dir"):
        from torchvision.datasets import CIFAR10, CIFAR100

        dataset = CIFAR100 if settings.get("name") == "cifar100" else CIFAR10
        found["CIFAR's folder in data.data_dir"] = (
            Path(str(value)).expanduser().resolve() / dataset.base_folder
        )
    return found


def check_apart(out: Path, inputs: dict[str, Path]) -> None:
    """A UserError when the output folder `out` is, contains or lies inside one of the input folders."""
    target = out.resolve()
    for key, folder in inputs.items():
        if target == folder:
            relation = "is"
        elif folder in target.parents:
            relation = "lies inside"
        elif target in folder.parents:
            relation = "contains"
        else:
            continue
        raise UserError(
            f"--output_dir {out} {relation} the input {key} {folder}: prepare never writes where it reads; "
            f"choose a new folder outside it, e.g. --output_dir {folder.parent / (folder.name + '_prepared')}"
        )


def _claim(state: str, shown: str, overwrite: bool) -> None:
    """A UserError unless an output in `state` ("empty", "dataset", "incomplete", "foreign", "file") may be
    written: a complete dataset only with `overwrite`, what prepare did not make never."""
    if state == "file":
        raise UserError(f"--output_dir {shown} is a file, not a folder")
    if state == "dataset" and not overwrite:
        raise UserError(
            f"--output_dir {shown} already holds a prepared dataset ({METADATA}); add --overwrite to replace it"
        )
    if state == "foreign":
        raise UserError(
            f"--output_dir {shown} is not empty and holds no dataset made by prepare (no {METADATA}): prepare "
            "writes only a new or empty folder, and --overwrite replaces only its own datasets; choose a new "
            "--output_dir"
        )


def _local_state(out: Path) -> str:
    """What the local output `out` holds (see `_claim`)."""
    if not out.exists():
        return "empty"
    if not out.is_dir():
        return "file"
    if not any(out.iterdir()):
        return "empty"
    if is_prepared(out):
        return "dataset"
    return "incomplete" if (out / INCOMPLETE).is_file() else "foreign"


def _write_error(code: int | None, reason: str, where: str | None, shown: str) -> str:
    """The one line for an OS error while writing the output: a full disk as every writer says it, a read-only
    disk or a missing permission naming the file."""
    at = f" ({where})" if where else ""
    if code in (errno.ENOSPC, errno.EDQUOT):
        return no_space_left(
            f"--output_dir {shown}{at}",
            "nothing was written there",
            "Free some space, or choose another --output_dir",
        )
    return f"cannot write --output_dir {shown}: {reason}{at}; nothing was written there"


@contextmanager
def _writing(shown: str, url: str | None = None) -> Iterator[None]:
    """OS errors inside the block (also those of litdata's worker processes) as one UserError line."""
    try:
        yield
    except OSError as e:
        line = _write_error(e.errno, e.strerror or str(e), e.filename, shown)
        raise UserError(hide_password(line, url or "")) from None
    except RuntimeError as e:  # litdata raises a worker's failure as a RuntimeError holding its traceback
        found = _OS_ERROR_LINE.findall(str(e))
        if not found:
            raise
        code, text = found[-1]
        reason, _, where = text.strip().partition(": ")
        line = _write_error(int(code), f"[Errno {code}] {reason}", where.strip("'") or None, shown)
        raise UserError(hide_password(line, url or "")) from None


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


def _lock_held(lock: Path) -> int | None:
    """The id of the live process holding the lock file (0 when it is being written), None for a stale one."""
    try:
        text, age = lock.read_text().strip(), time.time() - lock.stat().st_mtime
    except OSError:  # removed meanwhile
        return None
    if text.isdigit():
        return int(text) if _alive(int(text)) else None
    return 0 if age < 10 else None


def _create(lock: Path) -> bool:
    """Create the file `lock` holding this process's id; False when it exists."""
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True


@contextmanager
def _locked(out: Path, shown: str) -> Iterator[None]:
    """Hold the lock file beside `out` for the block; a UserError when a live process holds it. A lock whose
    process is gone (killed outright) is taken over."""
    lock = out.with_name(f".{out.name}.prepare.lock")
    for _ in range(2):
        with _writing(shown):
            if _create(lock):
                break
        holder = _lock_held(lock)
        if holder is not None:
            raise UserError(
                f"--output_dir {shown} is being written by another prepare (process {holder or '?'}, lock file "
                f"{lock}); "
                "wait for it to finish, or prepare into another folder"
            )
        lock.unlink(missing_ok=True)  # left by a prepare that was killed outright
    else:
        raise UserError(f"--output_dir {shown}: another prepare took its lock file {lock}; try again")
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _staging_folders(out: Path) -> Iterator[tuple[Path, int]]:
    """The staging folders of prepares into `out` (its swapped-out old datasets too), with their process ids."""
    name = re.compile(rf"^\.{re.escape(out.name)}\.prepare-(\d+)(?:-old)?$")
    for folder in out.parent.iterdir():
        match = name.match(folder.name)
        if match and folder.is_dir() and (folder / INCOMPLETE).is_file():
            yield folder, int(match[1])


def remove_stale_staging(out: Path) -> None:
    """Remove the staging folders beside `out` left by prepares killed outright (their process is gone)."""
    for folder, pid in _staging_folders(out):
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux's renameat2 with RENAME_EXCHANGE); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):  # not Linux, or a C library without it
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system that cannot exchange
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_tree(folder: Path) -> None:
    """Flush every file under `folder` to disk, so that the dataset swapped in survives a power cut whole."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in (folder, *(p for p in folder.rglob("*") if p.is_dir())):
        fsync_folder(path)


def _swap_in(staging: Path, out: Path) -> None:
    """Put the complete dataset `staging` at `out` in one step: the old dataset there (if any) is replaced
    whole, then removed. SIGTERM and Ctrl-C wait until the swap is done."""
    old: Path | None = None
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        if out.is_dir() and any(out.iterdir()):
            if _exchange(staging, out):
                old = staging
            else:  # two renames: a kill between them leaves the old dataset in the hidden -old folder
                old = staging.with_name(f"{staging.name}-old")
                os.rename(out, old)
                os.rename(staging, out)
            (old / INCOMPLETE).touch()  # ours to remove, should this process be killed before it is gone
        else:
            os.replace(staging, out)  # onto nothing, or onto an empty folder
        fsync_folder(out.parent)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class _Bucket:
    """An s3:// output: what it holds, its markers and metadata (boto3, as litdata uploads)."""

    def __init__(self, url: str) -> None:
        import boto3

        self.url = url.rstrip("/")
        self.shown = shown_url(self.url)
        self.bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.client = boto3.client("s3")

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except Exception as e:  # no credentials, no network, no such endpoint or bucket
            line = f"--output_dir {self.shown}: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
            raise UserError(hide_password(line, self.url)) from None

    def _exists(self, name: str) -> bool:
        listed = self._call("list_objects_v2", Prefix=self.prefix + name, MaxKeys=1).get("Contents", [])
        return any(item["Key"] == self.prefix + name for item in listed)

    def state(self) -> str:
        """What the prefix holds (see `_claim`)."""
        if self._exists(METADATA):
            text = self._call("get_object", Key=self.prefix + METADATA)["Body"].read().decode()
            try:
                meta = json.loads(text)
            except ValueError:
                meta = None
            if isinstance(meta, dict) and meta.get("format") == FORMAT:
                return "dataset"
        if self._exists(INCOMPLETE):
            return "incomplete"
        listed = self._call("list_objects_v2", Prefix=self.prefix, MaxKeys=1).get("Contents", [])
        return "foreign" if listed else "empty"

    def chunks_missing(self, split: str, names: list[str]) -> list[str]:
        """Which of the chunk files `names` of `split` are not in the bucket."""
        prefix = f"{self.prefix}{split}/"
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        found = {item["Key"].removeprefix(prefix) for page in pages for item in page.get("Contents", [])}
        return [n for n in names if n not in found]

    def read_index(self, split: str) -> str:
        return self._call("get_object", Key=f"{self.prefix}{split}/index.json")["Body"].read().decode()

    def put(self, name: str, text: str) -> None:
        self._call("put_object", Key=self.prefix + name, Body=text.encode())

    def delete(self, name: str) -> None:
        self._call("delete_object", Key=self.prefix + name)


def _open_bucket(output_dir: str) -> _Bucket:
    """The s3:// output `output_dir`, checked: a UserError for other schemes, a bare bucket-less URL, credentials
    in the URL or an endpoint litdata cannot reach."""
    shown = shown_url(output_dir)
    if not output_dir.startswith("s3://") or not output_dir.removeprefix("s3://").strip("/"):
        raise UserError(
            f"--output_dir {shown}: prepare writes a local folder or s3://bucket/prefix; for other "
            "object stores, prepare a local folder and copy it there as it is"
        )
    refuse_url_credentials(output_dir, "--output_dir")
    check_s3_endpoint(output_dir)
    return _Bucket(output_dir)


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
            source's data.seed; the DataModule's data.num_folds must match); null records none.
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
    settings: dict[str, Any] = {
        "size": size,
        "quality": quality,
        "chunk_bytes": chunk_size_bytes(chunk_bytes),
        "num_workers": num_workers,
    }
    _, parsed = parse_fit_args(fit_args or [])
    if "://" in output_dir:
        bucket = _open_bucket(output_dir)
        _claim(bucket.state(), bucket.shown, overwrite)
        source = _read_source(parsed, num_folds)
        stopped = (
            f"error: stopped by SIGTERM; {bucket.shown} holds no complete dataset now ({METADATA} is written "
            "last): prepare it again"
        )
        with _stop_on_sigterm(stopped), _writing(bucket.shown, bucket.url):
            bucket.put(INCOMPLETE, "")  # before the old metadata goes: the prefix stays recognisably ours
            bucket.delete(METADATA)
            metadata = _write_splits(litdata, *source, bucket.url, bucket.shown, bucket, **settings)
            bucket.put(METADATA, _metadata_text(metadata))
            bucket.delete(INCOMPLETE)
        shown = bucket.shown
    else:
        out = Path(output_dir).expanduser().absolute()
        shown = str(out)
        check_apart(out, input_folders(parsed.data))  # before anything is read
        _claim(_local_state(out), shown, overwrite)
        with _stop_on_sigterm(f"error: stopped by SIGTERM; prepare left --output_dir {out} as it was"):
            metadata = _prepare_folder(litdata, parsed, out, overwrite, num_folds, settings)
    splits = ", ".join(f"{s}: {n} images" for s, n in metadata["splits"].items())
    print(f"prepared {splits} in {shown}")
    return metadata


def _read_source(parsed: Any, num_folds: int | None) -> tuple[SourceSplits, list[int] | None]:
    """The source's splits (its training split in fold order) and the sizes of its folds."""
    from project.cli.config import build_datamodule

    source = read_source(build_datamodule(parsed))
    order, fold_sizes = fold_order(source, num_folds)
    files, labels = source.splits["train"]
    source.splits["train"] = ([files[i] for i in order], [labels[i] for i in order])
    return source, fold_sizes


def _prepare_folder(
    litdata: Any, parsed: Any, out: Path, overwrite: bool, num_folds: int | None, settings: dict[str, Any]
) -> dict[str, Any]:
    """Write the dataset into a staging folder beside `out` and swap it in, under the lock; a failure removes
    the staging folder, the lock and the parent folders this call created."""
    shown = str(out)
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        with _writing(shown):
            out.parent.mkdir(parents=True, exist_ok=True)
        with _locked(out, shown):
            _claim(_local_state(out), shown, overwrite)  # again, now that no other prepare can change it
            remove_stale_staging(out)
            source, fold_sizes = _read_source(parsed, num_folds)
            staging = out.with_name(f".{out.name}.prepare-{os.getpid()}")
            try:
                with _writing(shown):
                    shutil.rmtree(staging, ignore_errors=True)
                    staging.mkdir()
                    (staging / INCOMPLETE).touch()
                    metadata = _write_splits(
                        litdata, source, fold_sizes, str(staging), shown, None, **settings
                    )
                    (staging / METADATA).write_text(_metadata_text(metadata))
                    (staging / INCOMPLETE).unlink()
                    _fsync_tree(staging)
                    _swap_in(staging, out)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # gone already, unless this failed
    except BaseException:
        for folder in created:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return metadata


def _write_splits(
    litdata: Any,
    source: SourceSplits,
    fold_sizes: list[int] | None,
    root: str,
    shown: str,
    bucket: _Bucket | None,
    size: int | None,
    quality: int,
    chunk_bytes: int,
    num_workers: int | None,
) -> dict[str, Any]:
    """Write every split of `source` under `root` (a local folder or the bucket's URL) and return the metadata
    to write last; `shown` is how messages name the output."""
    from project.machine import available_cpus

    workers = num_workers or available_cpus()
    classes, targets = source.classes, source.targets
    counts: dict[str, int] = {}
    with _own_litdata_folders():
        for split, (files, labels) in source.splits.items():
            counts[split] = _write_split(litdata, split, files, labels, source, root, shown, bucket, size,
                                         quality, chunk_bytes, workers)  # fmt: skip
    stats_size = min(size or 256, source.image_size)
    mean, std = mean_std(source.splits["train"][0], stats_size, source.max_pixels)
    return {
        "format": FORMAT,
        "classes": classes,
        "targets": targets.kind,
        "splits": counts,
        # Fold k of the training split is its samples sum(sizes[:k]) to sum(sizes[:k + 1]).
        "folds": None if fold_sizes is None else {"seed": source.seed, "sizes": fold_sizes},
        "size": size,
        "mean": mean,
        "std": std,
        "source": source.name,
    }


def _write_split(
    litdata: Any,
    split: str,
    files: list[Any],
    labels: list[Any],
    source: SourceSplits,
    root: str,
    shown: str,
    bucket: _Bucket | None,
    size: int | None,
    quality: int,
    chunk_bytes: int,
    workers: int,
) -> int:
    """Write one split under `root` with litdata, checked complete; the number of images written."""
    items = [
        (f, source.targets.stored(y), size, quality, source.max_pixels, i)
        for i, (f, y) in enumerate(zip(files, labels, strict=True))
    ]
    with _ending_children(), _full_disk_named(root if bucket is None else _litdata_cache(), chunk_bytes):
        litdata.optimize(
            fn=encode_sample,
            inputs=items,
            output_dir=f"{root}/{split}",
            chunk_bytes=chunk_bytes,
            num_workers=min(workers, max(1, len(items))),
            mode="overwrite",
            verbose=False,
        )
    _check_complete(root, shown, split, bucket)
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


def _metadata_text(metadata: dict[str, Any]) -> str:
    return json.dumps(metadata, indent=2) + "\n"


def _check_complete(root: str, shown: str, split: str, bucket: _Bucket | None) -> None:
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


def parse_args(args: list[str]) -> dict[str, Any]:
    """The keyword arguments of `prepare` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(prepare, args, prog="python -m project prepare")


def main(args: list[str]) -> None:
    prepare(**parse_args(args))


__all__ = ["MAX_IMAGE_PIXELS", "METADATA", "prepare"]
