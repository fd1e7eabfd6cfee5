"""The metadata of a dataset `python -m project prepare` made (`streaming.json`), read from a local folder or
object storage, and the check of an S3 endpoint that litdata cannot reach.

Kept apart from the converter, so that reading a dataset does not import it.
"""

import json
from pathlib import Path
from typing import Any

from project.errors import UserError

#: The metadata file `prepare` writes last; its presence marks the dataset complete.
METADATA = "streaming.json"
#: The version of the sample layout and metadata `prepare` writes (and the DataModule reads).
FORMAT = 1


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
            f"{url}: the S3 endpoint {endpoint} is plain http, which litdata's object-store client (obstore) "
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
            found = (
                "an interrupted prepare (its splits without "
                if (folder / "train").is_dir()
                else "not a dataset "
            )
            raise UserError(
                f"data.input_dir {folder} has no {METADATA}: {found}made by `python -m project prepare`); run "
                f"prepare again with --output_dir {folder}"
            )
        text = path.read_text()
    else:
        text = _read_remote(input_dir.rstrip("/") + "/" + METADATA)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{input_dir}/{METADATA} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(
            f"{input_dir}/{METADATA} is not a dataset of this version of `python -m project prepare` "
            f"(format {meta.get('format') if isinstance(meta, dict) else None}, expected {FORMAT}); prepare it again"
        )
    return meta


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
        raise UserError(
            f"cannot read {url}: {type(e).__name__}: {str(e).strip().splitlines()[0]}{hint}"
        ) from None
