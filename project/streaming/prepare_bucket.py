"""An s3:// output of `python -m project prepare`: litdata uploads each chunk as it is written (the endpoint, e.g.
of an S3-compatible server, comes from AWS_ENDPOINT_URL like the credentials from the AWS variables). The
prefix carries the `.prepare-incomplete` key until `streaming.json` is written last; a prefix holding neither is
never written.
"""

import json
from typing import Any

from project.errors import UserError
from project.streaming.metadata import (
    FORMAT,
    METADATA,
    check_s3_endpoint,
    hide_password,
    refuse_url_credentials,
    shown_url,
)
from project.streaming.prepare_output import INCOMPLETE


class Bucket:
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
        """What the prefix holds (see `prepare_output.claim`)."""
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


def open_bucket(output_dir: str) -> Bucket:
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
    return Bucket(output_dir)
