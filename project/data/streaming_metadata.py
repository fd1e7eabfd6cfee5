"""The metadata of a dataset `python -m project prepare` made (`streaming.json`), read from a local folder or
object storage, and the check of an S3 endpoint that litdata cannot reach.

Kept apart from the converter, so that reading a dataset does not import it.
"""

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from project.data.images import IMAGE_EXTENSIONS
from project.errors import UserError
from project.run.redaction import REDACTED, URL_PASSWORD

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
    return meta


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
        else "not a dataset made by `python -m project prepare`"
    )
    return (
        f"data.input_dir {folder} has no {METADATA}: {what}; prepare the images into a new folder (python -m "
        f"project prepare --config CONFIG --data.root IMAGES --output_dir {new}) and pass that as --data.input_dir"
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
