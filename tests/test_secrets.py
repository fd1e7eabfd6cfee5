"""No secret in a log: a password in a URL, or the value of a setting named like a secret, never reaches a file a
run writes (config.yaml, hparams.yaml, run_info.json, the checkpoints, the W&B run), and a run given the same
secret still continues with `--ckpt_path last`."""

import os
from pathlib import Path

import pytest

from project.redaction import REDACTED, redact_config
from tests.conftest import run_cli
from tests.folder_fits import tiny_fit_args, tiny_folder

PASSWORD = "Hunter2Secret"


def test_a_config_is_recorded_without_url_passwords_or_secret_settings():
    config = {
        "data": {"init_args": {"root": f"s3://ann:{PASSWORD}@bucket/images", "size": 3, "token": PASSWORD}},
        "urls": [f"https://bob:{PASSWORD}@example.com/x", "https://example.com/y"],
        "api_key": None,  # nothing to hide
        "sizes": (1, 2),
    }
    redacted = redact_config(config)
    assert redacted == {
        "data": {"init_args": {"root": f"s3://ann:{REDACTED}@bucket/images", "size": 3, "token": REDACTED}},
        "urls": [f"https://bob:{REDACTED}@example.com/x", "https://example.com/y"],
        "api_key": None,
        "sizes": (1, 2),
    }
    assert config["data"]["init_args"]["token"] == PASSWORD  # the config itself is left as it was


def files_holding(folder: Path, secret: str) -> list[str]:
    """The files under `folder` whose bytes hold `secret` (checkpoints are uncompressed zip files of pickles, W&B
    runs protobuf records: a string stored in either is there as it is)."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_a_fit_given_a_password_writes_it_nowhere_and_continues_with_the_same_one(tmp_path):
    # Class folders under a path that reads as a URL with a password (POSIX joins its `//`).
    root = f"s3://ann:{PASSWORD}@bucket/images"
    tiny_folder(tmp_path / os.path.normpath(root))
    args = tiny_fit_args(root, tmp_path, "--trainer.max_epochs", "1")  # type: ignore[arg-type]  # as given
    run_cli("fit", *args, cwd=tmp_path)
    run = tmp_path / "logs" / "runs" / "version_0"
    written = {p.name for p in run.rglob("*")}
    assert {"config.yaml", "hparams.yaml", "run_info.json", "last.ckpt"} <= written
    assert list((tmp_path / "logs" / "wandb").glob("offline-run-*/*.wandb"))
    assert files_holding(tmp_path / "logs", PASSWORD) == []
    assert f"s3://ann:{REDACTED}@bucket/images" in (run / "config.yaml").read_text()

    # The same command, continued: its redacted settings are the checkpoint's, so the run goes on in its folder.
    run_cli("fit", *args, "--trainer.max_epochs", "2", "--ckpt_path", "last", cwd=tmp_path)
    assert [p.name for p in (tmp_path / "logs" / "runs").glob("version_*")] == ["version_0"]
    assert files_holding(tmp_path / "logs", PASSWORD) == []
