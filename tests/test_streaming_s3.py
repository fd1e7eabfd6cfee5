"""Streaming from object storage, against moto's in-process S3 emulation served over HTTPS by the test itself
(tests/s3_server.py), not AWS: `prepare --output_dir s3://...` uploads the chunks and the metadata, `fit` from
`s3://...` downloads the chunks through a loader worker into its cache, and what cannot work is one line.
"""

import json
from pathlib import Path

import pytest

from project.cli import main
from project.streaming.source import METADATA
from tests.conftest import CONFIGS
from tests.fakes import make_image_folder
from tests.s3_server import s3_server
from tests.test_streaming import fit_args, one_line_error

pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")

URL = "s3://bucket/prepared"


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> object:
    with s3_server(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


def prepare_into(url: str, root: Path, *extra: str) -> list[str]:
    images = root / "images"
    if not images.exists():
        make_image_folder(images, classes=2, per_class=6, extras=False)
    args = ["prepare", "--config", CONFIGS / "folder.yaml", "--data.root", images]
    args += ["--data.cache_dir", root / "cache", "--output_dir", url, "--size", "16", "--num_workers", "1"]
    return [*map(str, args), *extra]


def keys(prefix: str) -> list[str]:
    import boto3

    listed = boto3.client("s3").list_objects_v2(Bucket="bucket", Prefix=prefix).get("Contents", [])
    return sorted(item["Key"].removeprefix(prefix) for item in listed)


@pytest.mark.slow
def test_prepare_into_a_bucket_then_fit_from_it(s3, tmp_path, capsys):
    main(prepare_into(URL, tmp_path))
    stored = keys("prepared/")
    assert METADATA in stored and "train/index.json" in stored and "val/index.json" in stored
    assert any(k.startswith("train/chunk-") and k.endswith(".bin") for k in stored)
    import boto3

    meta = json.loads(
        boto3.client("s3").get_object(Bucket="bucket", Key=f"prepared/{METADATA}")["Body"].read()
    )
    assert meta["splits"] == {"train": 10, "val": 2} and meta["classes"] == ["c0", "c1"]

    chunks = tmp_path / "chunks"
    run = ["--data.cache_dir", str(chunks), "--data.num_workers", "1", "--trainer.max_steps", "3"]
    main(fit_args(URL, tmp_path, *run, "--trainer.limit_val_batches", "1"))
    assert list(tmp_path.glob("runs/version_*/checkpoints/last.ckpt"))
    assert list((chunks / "train").rglob("chunk-*.bin"))  # downloaded from the bucket, one folder per split

    err = one_line_error(prepare_into(URL, tmp_path), capsys)
    assert f"--output_dir {URL} already holds a prepared dataset" in err and "--overwrite" in err


def test_a_prefix_without_a_dataset_is_one_line(s3, tmp_path, capsys):
    err = one_line_error(fit_args("s3://bucket/nothing", tmp_path), capsys)
    assert f"cannot read s3://bucket/nothing/{METADATA}" in err
    assert "not a dataset made by `python -m project prepare`, or an interrupted one" in err


def test_a_plain_http_endpoint_is_one_line(s3, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.replace("https://", "http://"))
    err = one_line_error(fit_args(URL, tmp_path), capsys)
    assert "is plain http, which litdata's object-store client (obstore) refuses" in err
    err = one_line_error(prepare_into("s3://bucket/other", tmp_path), capsys)
    monkeypatch.undo()
    assert "is plain http" in err and not keys("other/")  # refused before anything was written
