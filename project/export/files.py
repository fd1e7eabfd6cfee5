"""Atomic writes: a command that fails leaves no partial file behind."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_outputs(output_dir: str | Path, last: tuple[str, ...] = (".json",)) -> Iterator[Path]:
    """Yield a hidden staging folder inside `output_dir`; move its files into `output_dir` only on success.

    Files are written and verified in the staging folder, then renamed into place (a rename is atomic on
    one filesystem). Files whose names end with one of `last` move last, so a metadata JSON never names a
    model that is not there yet. On any exception nothing is moved, the staging folder is deleted, and an
    `output_dir` this call created is removed again.
    """
    output_dir = Path(output_dir)
    created = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=output_dir))
    try:
        yield staging
        files = sorted(staging.iterdir(), key=lambda p: (p.name.endswith(last), p.name))
        for file in files:
            os.replace(file, output_dir / file.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(output_dir.iterdir()):
            output_dir.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_size_mb(path: str | Path) -> float:
    return Path(path).stat().st_size / 2**20
