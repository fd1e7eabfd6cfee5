"""The metadata of a dataset `python -m project prepare` made (`streaming.json`), read from a local folder or
object storage, and the check of an S3 endpoint that litdata cannot reach.

Kept apart from the converter, so that reading a dataset does not import it.
"""

import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from project import USAGE
from project.data.image_reading import IMAGE_EXTENSIONS
from project.errors import UserError
from project.redaction import REDACTED, URL_PASSWORD

#: The metadata file `prepare` writes last; its presence marks the dataset complete.
METADATA = "streaming.json"
#: The version of the sample layout and metadata `prepare` writes (and the DataModule reads).
FORMAT = 1


#: Entries looked at, at most, to tell an image tree given as a prepared dataset.
IMAGE_LOOKS = 2000


def shown_url(url: str) -> str:
    """`url` as a message may print it: a password in it replaced by `***`."""
    return URL_PASSWORD.sub(lambda m: m["head"] + REDACTED + "@", url)


def hide_password(text: str, url: str) -> str:
    """`text` (an error line, perhaps quoting `url` in a library's own words) without the password of `url`."""
    match = URL_PASSWORD.search(url)
    return text.replace(match["password"], REDACTED) if match and match["password"] else text


def refuse_url_credentials(url: str, key: str) -> None:
    """A UserError (the password hidden) for an s3:// URL carrying credentials, which neither boto3 nor litdata
    read: they come from the AWS variables or files."""
    if url.startswith("s3://") and "@" in urlsplit(url).netloc:
        raise UserError(
            f"{key} {shown_url(url)}: an s3:// URL takes no user or password; give s3://BUCKET/PREFIX and the "
            "credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials)"
        )


def check_s3_endpoint(url: str) -> None:
    """A UserError when the S3 endpoint boto3 is configured with (AWS_ENDPOINT_URL, ~/.aws/config) is plain
    http and litdata's object-store client would refuse it (it builds obstore's client without `allow_http`):
    one line instead of obstore's error from inside a loader worker."""
    import boto3

    endpoint = boto3.client("s3").meta.endpoint_url or ""
    try:
        from litdata.streaming.downloader import (
            _OBSTORE_CLIENT_OPTIONS,  # pyright: ignore[reportPrivateUsage]
            obstore_usable,
        )
    except ImportError:  # another litdata: its own errors then
        return
    if endpoint.startswith("http://") and obstore_usable() and not _OBSTORE_CLIENT_OPTIONS.get("allow_http"):
        raise UserError(
            f"{shown_url(url)}: the S3 endpoint {endpoint} is plain http, which litdata's object-store client (obstore) "
            "refuses; serve it over https (a self-signed certificate's authority named by AWS_CA_BUNDLE and "
            "SSL_CERT_FILE)"
        )


def read_metadata(input_dir: str) -> dict[str, Any]:
    """The metadata of a prepared dataset at `input_dir` (a folder or a URL litdata reads); a UserError when
    there is none (a missing folder, another kind of data, or an interrupted prepare)."""
    if "://" not in input_dir:
        folder = Path(input_dir).expanduser()
        if not folder.is_dir():
            raise UserError(f"data.input_dir {folder} does not exist or is not a directory")
        path = folder / METADATA
        if not path.is_file():
            raise UserError(_not_prepared(folder))
        text = path.read_text()
    else:
        refuse_url_credentials(input_dir, "data.input_dir")
        text = _read_remote(input_dir.rstrip("/") + "/" + METADATA)
    shown = shown_url(input_dir)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{shown}/{METADATA} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(
            f"{shown}/{METADATA} is not a dataset of this version of `python -m project prepare` "
            f"(format {meta.get('format') if isinstance(meta, dict) else None}, expected {FORMAT}); prepare it again"
        )
    problem = metadata_problem(meta)
    if problem is None and "://" not in input_dir:
        problem = chunks_problem(Path(input_dir).expanduser(), meta["splits"])
    if problem is not None:
        raise UserError(
            f"{shown}: {problem}; the prepared dataset was edited or damaged: prepare it again (python -m project "
            "prepare ... --overwrite true)"
        )
    return meta


def _count(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _numbers(value: Any, positive: bool = False) -> bool:
    """Whether `value` is three finite numbers (positive ones with `positive`), as mean and std are."""
    return (
        isinstance(value, list)
        and len(value) == 3
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        and (not positive or all(v > 0 for v in value))
    )


def metadata_problem(meta: dict[str, Any]) -> str | None:
    """What in a prepared dataset's metadata is not as `prepare` writes it (a hand edit, a damaged file), in
    words naming the entry; None when every entry the DataModule reads is well-formed."""
    classes, splits, folds = meta.get("classes"), meta.get("splits"), meta.get("folds")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) and c for c in classes):
        return f"{METADATA} 'classes' must be a list of names, got {str(classes)[:80]}"
    if len(set(classes)) != len(classes):
        twice = next(c for c in classes if classes.count(c) > 1)
        return f"{METADATA} 'classes' names {twice!r} twice"
    if not isinstance(meta.get("targets", ""), str) or not isinstance(meta.get("multilabel", False), bool):
        return f"{METADATA} 'targets' must be the kind of target prepare recorded"
    if not isinstance(splits, dict) or not all(isinstance(k, str) and _count(n) for k, n in splits.items()):
        return f"{METADATA} 'splits' must map each split to its number of images, got {str(splits)[:80]}"
    for split in ("train", "val"):
        if not _count(splits.get(split), 1):
            return f"{METADATA} 'splits' has no {split} images"
    if folds is not None:
        sizes = folds.get("sizes") if isinstance(folds, dict) else None
        if not isinstance(sizes, list) or len(sizes) < 2 or not all(_count(n, 1) for n in sizes):
            return f"{METADATA} 'folds' must hold the sizes of two or more folds, got {str(folds)[:80]}"
        if sum(sizes) != splits["train"] or not _count(folds.get("seed")):
            return f"{METADATA} 'folds' sizes add up to {sum(sizes)} images, the train split holds {splits['train']}"
    if not _numbers(meta.get("mean")) or not _numbers(meta.get("std"), positive=True):
        return f"{METADATA} 'mean' and 'std' must be three numbers each (std above 0)"
    if meta.get("size") is not None and not _count(meta.get("size"), 1):
        return f"{METADATA} 'size' must be a number of pixels, got {meta.get('size')!r}"
    return None


def chunks_problem(folder: Path, splits: dict[str, int]) -> str | None:
    """What is missing or cut short among the chunks of a local prepared dataset: each split's index must be
    readable, count the images the metadata says, and name chunk files of the sizes it records; None when all
    are there. A stat per chunk, nothing read."""
    for split, count in splits.items():
        index = folder / split / "index.json"
        try:
            content = json.loads(index.read_text())
            chunks = content["chunks"]
            compressed = bool((content.get("config") or {}).get("compression"))
            listed = [(str(c["filename"]), int(c["chunk_bytes"]), int(c["chunk_size"])) for c in chunks]
        except FileNotFoundError:
            return f"{split}/index.json is missing"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"{split}/index.json is unreadable ({type(e).__name__}: {e})"
        held = sum(size for _, _, size in listed)
        if held != count:
            return f"{METADATA} says the {split} split holds {count} images, its index.json {held}"
        for name, size, _ in listed:
            try:
                found = (folder / split / name).stat().st_size
            except OSError:
                return f"the chunk {split}/{name} is missing"
            if found != size and not compressed:
                return (
                    f"the chunk {split}/{name} has {found} bytes, its index.json records {size} (cut short)"
                )
    return None


def _not_prepared(folder: Path) -> str:
    """Why the local folder `folder` without metadata is no dataset, and the command that makes one from it:
    always into a new folder, never into the folder itself (which may be the images)."""
    new = folder.parent / f"{folder.name}_prepared"
    if _holds_images(folder):
        return (
            f"data.input_dir {folder} holds image files, not a dataset made by `python -m project prepare` (no "
            f"{METADATA}); prepare them into a new folder first: python -m project prepare --config "
            f"configs/folder.yaml --data.root {folder} --output_dir {new}, then fit with --data.input_dir {new}"
        )
    what = (
        "litdata chunks without the metadata prepare writes last (another tool's dataset, or an interrupted "
        "prepare of an earlier version)"
        if (folder / "train" / "index.json").is_file()
        else f"not a dataset made by `{USAGE} prepare`"
    )
    return (
        f"data.input_dir {folder} has no {METADATA}: {what}; prepare the images into a new folder ({USAGE} "
        f"prepare --config CONFIG --data.root IMAGES --output_dir {new}) and pass that as --data.input_dir"
    )


def _holds_images(folder: Path) -> bool:
    """Whether image files lie within three levels of `folder` (`class/`, `train/class/`), looking at no more
    than IMAGE_LOOKS entries."""
    looked, level = 0, [folder]
    for _ in range(3):
        below: list[Path] = []
        for parent in level:
            try:
                entries = list(parent.iterdir())
            except OSError:
                continue
            for entry in entries:
                looked += 1
                if entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                    return True
                if entry.is_dir():
                    below.append(entry)
                if looked >= IMAGE_LOOKS:
                    return False
        level = below
    return False


def _read_remote(url: str) -> str:
    """A small text file from object storage. Not through obstore: its runtime, once started in this process,
    does not survive the fork of the loader workers (a segmentation fault)."""
    import tempfile

    if url.startswith("s3://"):
        check_s3_endpoint(url)
    try:
        if url.startswith("s3://"):  # boto3, as litdata reads its index files
            import boto3

            bucket, _, key = url.removeprefix("s3://").partition("/")
            return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        from litdata.streaming.downloader import get_downloader

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / METADATA
            get_downloader(url.rpartition("/")[0], tmp, []).download_file(url, str(local))
            return local.read_text()
    except (
        Exception
    ) as e:  # each storage client raises its own types for missing objects, credentials, networks
        missing = "NoSuchKey" in type(e).__name__ or "Not Found" in str(e) or "NoSuchKey" in str(e)
        hint = (
            ": not a dataset made by `python -m project prepare`, or an interrupted one (prepare it again)"
            if missing
            else ""
        )
        line = f"cannot read {shown_url(url)}: {type(e).__name__}: {str(e).strip().splitlines()[0]}{hint}"
        raise UserError(hide_password(line, url)) from None
