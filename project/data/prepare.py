"""`python -m project prepare`: an image dataset (class folders, CSV, multi-label CSV, CIFAR) converted into
litdata's chunked format, for `StreamingImageDataModule` to stream from a local folder or object storage.

Every split (train, val, test) becomes one optimized litdata dataset in its own sub-folder of the output:
each sample is the image as JPEG bytes, its shorter side resized to `size` (the source resolution the
loader's crop starts from), its target (the class index, or a multi-hot uint8 row of tags) and its index in
the split. The class names, whether the data is multi-label, the splits with their sizes, the folds of the
training split and the training images' per-channel mean and std go into `streaming.json`, written last
(atomically on a local disk; an object store's single PUT is atomic too): an output without it is an
interrupted prepare, which the DataModule refuses and a new prepare overwrites. The output is a local folder
or an s3:// URL (litdata uploads each chunk as it is written; the endpoint, e.g. of an S3-compatible server,
comes from AWS_ENDPOINT_URL like the credentials from the AWS variables).

litdata is an optional extra (`pip install -e ".[streaming]"`), imported only here and in the DataModule.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from project.atomic_files import atomic_write_text
from project.data.images import MAX_IMAGE_PIXELS
from project.data.prepare_sources import encode_sample, fold_order, mean_std, read_source, target_of
from project.data.streaming_metadata import FORMAT, METADATA, check_s3_endpoint
from project.errors import UserError

SPLITS = ("train", "val", "test")


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
    return (folder / METADATA).is_file()


class _Bucket:
    """An s3:// output: whether it holds the metadata, removing it, writing it (boto3, as litdata uploads)."""

    def __init__(self, url: str) -> None:
        import boto3

        self.url = url.rstrip("/")
        self.bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        self.key = f"{prefix}/{METADATA}" if prefix else METADATA
        self.client = boto3.client("s3")

    def has_metadata(self) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise UserError(f"--output_dir {self.url}: {e}") from None
        except Exception as e:  # no credentials, no network, no such endpoint
            raise UserError(f"--output_dir {self.url}: {type(e).__name__}: {e}") from None
        return True

    def chunks_missing(self, split: str, names: list[str]) -> list[str]:
        """Which of the chunk files `names` of `split` are not in the bucket."""
        prefix = f"{self.key.removesuffix(METADATA)}{split}/"
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        found = {item["Key"].removeprefix(prefix) for page in pages for item in page.get("Contents", [])}
        return [n for n in names if n not in found]

    def read_index(self, split: str) -> str:
        key = f"{self.key.removesuffix(METADATA)}{split}/index.json"
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()

    def remove_metadata(self) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key)

    def write_metadata(self, text: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=text.encode())


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
    written last, holds the class names, the splits, the folds and the training images' mean and std: until
    it exists the output is incomplete.

    Args:
        output_dir: Where the prepared dataset goes: a local folder (created), or an s3:// URL (a bucket and
            prefix; the endpoint of an S3-compatible server from AWS_ENDPOINT_URL).
        size: Shorter side of the stored images, in pixels (never enlarged); null keeps the source resolution.
        quality: JPEG quality of re-encoded images (1-95).
        chunk_bytes: Size of litdata's chunks (the unit each worker downloads and reads).
        num_workers: Parallel encoding processes; default: one per available CPU.
        num_folds: Stratified folds of the training split recorded for `python -m project cv` (seeded by the
            source's data.seed; the DataModule's data.num_folds must match); null records none.
        overwrite: Replace a dataset already prepared in output_dir (refused otherwise).
        fit_args: The `--config` file(s) and `--data.*` flags that name the source, read as `fit` reads them
            (e.g. --config configs/folder.yaml --data.root path/to/images).
    """
    from project.cli.config import build_datamodule, parse_fit_args
    from project.data.datamodule import available_cpus

    litdata = require_litdata()
    if size is not None and size < 1:
        raise UserError(f"--size must be at least 1 pixel (or null for the source resolution), got {size}")
    if not 1 <= quality <= 95:
        raise UserError(f"--quality must be between 1 and 95, got {quality}")
    bucket: _Bucket | None = None
    if "://" in output_dir:
        if not output_dir.startswith("s3://") or not output_dir.removeprefix("s3://").strip("/"):
            raise UserError(
                f"--output_dir {output_dir}: prepare writes a local folder or s3://bucket/prefix; for other "
                "object stores, prepare a local folder and copy it there as it is"
            )
        check_s3_endpoint(output_dir)
        bucket = _Bucket(output_dir)
        out_name = bucket.url
        done = bucket.has_metadata()
    else:
        out = Path(output_dir).expanduser()
        out_name = str(out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--output_dir {out} is a file, not a folder")
        done = is_prepared(out)
    if done and not overwrite:
        raise UserError(
            f"--output_dir {out_name} already holds a prepared dataset ({METADATA}); add --overwrite to replace it"
        )
    _, parsed = parse_fit_args(fit_args or [])
    source = read_source(build_datamodule(parsed))
    order, fold_sizes = fold_order(source, num_folds)
    files, labels = source.splits["train"]
    source.splits["train"] = ([files[i] for i in order], [labels[i] for i in order])
    # An overwrite in progress is incomplete too.
    if bucket is not None:
        bucket.remove_metadata()
    else:
        (Path(out_name) / METADATA).unlink(missing_ok=True)
    workers = num_workers or available_cpus()
    classes, multilabel = source.classes, source.multilabel

    counts: dict[str, int] = {}
    for split, (files, labels) in source.splits.items():
        target = f"{out_name}/{split}"
        if bucket is None and Path(target).exists():
            shutil.rmtree(target)  # a split of an interrupted (or replaced) prepare
        items = [
            (f, target_of(y, len(classes), multilabel), size, quality, source.max_pixels, i)
            for i, (f, y) in enumerate(zip(files, labels, strict=True))
        ]
        litdata.optimize(
            fn=encode_sample,
            inputs=items,
            output_dir=target,
            chunk_bytes=chunk_bytes,
            num_workers=min(workers, max(1, len(items))),
            mode="overwrite",
            verbose=False,
        )
        _check_complete(out_name, split, bucket)
        counts[split] = len(items)

    stats_size = min(size or 256, source.image_size)
    mean, std = mean_std(source.splits["train"][0], stats_size, source.max_pixels)
    metadata = {
        "format": FORMAT,
        "classes": classes,
        "multilabel": multilabel,
        "splits": counts,
        # Fold k of the training split is its samples sum(sizes[:k]) to sum(sizes[:k + 1]).
        "folds": None if fold_sizes is None else {"seed": source.seed, "sizes": fold_sizes},
        "size": size,
        "mean": mean,
        "std": std,
        "source": source.name,
    }
    text = json.dumps(metadata, indent=2) + "\n"
    if bucket is not None:
        bucket.write_metadata(text)
    else:
        atomic_write_text(Path(out_name) / METADATA, text)
    print(f"prepared {', '.join(f'{s}: {n} images' for s, n in counts.items())} in {out_name}")
    return metadata


def _check_complete(out_name: str, split: str, bucket: _Bucket | None) -> None:
    """A UserError (and no metadata written) when a chunk of `split`'s index is not at the output: litdata's
    writer or uploader processes can fail without `optimize` raising."""
    try:
        text = bucket.read_index(split) if bucket else (Path(out_name) / split / "index.json").read_text()
        names = [chunk["filename"] for chunk in json.loads(text)["chunks"]]
    except Exception as e:  # no index at all: the split was not written
        raise UserError(f"prepare of {out_name}/{split} did not finish ({type(e).__name__}: {e})") from None
    if bucket is not None:
        missing = bucket.chunks_missing(split, names)
    else:
        missing = [n for n in names if not (Path(out_name) / split / n).is_file()]
    if missing:
        raise UserError(
            f"prepare of {out_name}/{split} did not finish: {len(missing)} of its {len(names)} chunks are missing "
            f"({missing[0]}, ...); {METADATA} was not written, run prepare again"
        )


def parse_args(args: list[str]) -> dict[str, Any]:
    """The keyword arguments of `prepare` for a command line (checks it without running anything)."""
    from project.cli.config import parse_tool_args

    return parse_tool_args(prepare, args, prog="python -m project prepare")


def main(args: list[str]) -> None:
    prepare(**parse_args(args))


__all__ = ["MAX_IMAGE_PIXELS", "METADATA", "prepare"]
