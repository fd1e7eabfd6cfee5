"""Atomic writes: whatever kills the process, a file is either its complete old version or its complete new one.

Every writer of the template goes through here: checkpoints, exports, the image cache and its statistics,
run info, predictions, INT8 programs. A file is written under a hidden temporary name in its own folder (same
file system, so the rename is atomic), flushed to disk with fsync, renamed over the target, and the folder is
fsync'ed so that the new name survives a power cut too. A failure (an exception, Ctrl-C, a full disk) removes
the temporary file; a SIGKILL leaves at most a hidden `.NAME.<pid>.partial` beside the target, never a
truncated target.
"""

import errno
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

PARTIAL_SUFFIX = ".partial"
#: The hidden staging folders of `staged_outputs`, named by the process that writes them.
STAGING = re.compile(r"^\.staging-(\d+)-")


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC or a full quota (EDQUOT), also as torch's zip writer reports it from C++ ("unexpected pos")."""
    return (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        text in str(error) for text in ("unexpected pos", "No space left on device", "Disk quota exceeded")
    )


def no_space_left(what: str, outcome: str, fix: str) -> str:
    """The one line every writer gives for a full disk: what it could not write, what that left, what to do."""
    return f"no space left on the device to write {what}; {outcome}. {fix}"


def partial_path(path: str | os.PathLike) -> Path:
    """The hidden temporary file this process writes `path` to before renaming it into place."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}{PARTIAL_SUFFIX}")


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make renames in `folder` durable (its entries live in the folder's own metadata)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: str | os.PathLike, keep_name: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new content to; on success it replaces `path` atomically.

    With `keep_name`, the temporary file has `path`'s own name, inside a hidden temporary folder beside it
    (for writers that record the file name inside the file, such as `torch.export.save`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = (
        Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX, dir=path.parent))
        if keep_name
        else None
    )
    tmp = folder / path.name if folder else partial_path(path)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
        fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_staging(output_dir: Path) -> None:
    """Remove the staging folders in `output_dir` left by processes that are gone (killed by SIGKILL)."""
    for folder in output_dir.glob(".staging-*"):
        match = STAGING.match(folder.name)
        if match and int(match[1]) != os.getpid() and not _alive(int(match[1])):
            shutil.rmtree(folder, ignore_errors=True)


class Terminated(SystemExit):
    """SIGTERM arrived while outputs were being staged: raised in the main thread so the staging is undone."""


@contextmanager
def stop_on_sigterm(message: str) -> Iterator[None]:
    """Within the block, SIGTERM (whose default action ends the process at once, skipping every `finally`, so
    temporary files stay) prints `message` as one line and raises `Terminated` (exit status 143), so every
    `finally` runs; only in the main thread and where no other handler is installed."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def stop(signum: int, frame: object) -> None:
        print(message, file=sys.stderr, flush=True)
        raise Terminated(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def staged_outputs(
    output_dir: str | os.PathLike, last: tuple[str, ...] = (".json",), replaces: Iterable[str] = ()
) -> Iterator[Path]:
    """Yield a hidden staging folder inside `output_dir`; its files move into `output_dir` only on success.

    Files are written and verified in the staging folder, fsync'ed, then renamed into place. Files whose
    names end with one of `last` move last, so a metadata JSON never names a model that is not there yet; the
    files named in `replaces` that were not written this time are removed (an earlier set of outputs is
    replaced whole). On any exception, or SIGTERM, nothing is moved, the staging folder is deleted, and an
    `output_dir` this call created is removed again. Staging folders of processes killed outright (SIGKILL)
    are removed by the next call for the same folder.
    """
    output_dir = Path(output_dir)
    created = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(output_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=output_dir))
    try:
        with stop_on_sigterm(
            f"error: stopped by SIGTERM while writing {output_dir}; nothing was written there"
        ):
            yield staging
            files = sorted(staging.iterdir(), key=lambda p: (p.name.endswith(last), p.name))
            for file in files:
                _fsync_file(file)
            for file in files:
                os.replace(file, output_dir / file.name)
            for name in set(replaces) - {file.name for file in files}:
                (output_dir / name).unlink(missing_ok=True)
            fsync_folder(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(output_dir.iterdir()):
            output_dir.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_writable(folder: str | os.PathLike, key: str, hint: str = "") -> None:
    """A UserError naming the setting `key` unless `folder` can be created and written; leaves no trace.

    Probes the folder, or its nearest existing parent when it does not exist yet, with a temporary file.
    """
    from project.errors import UserError

    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, f"{existing} is a file")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise UserError(
            f"{key} {folder} is not a writable folder ({e.strerror or e}); choose another with --{key} PATH"
            + (f", {hint}" if hint else "")
        ) from None


def file_size_mb(path: str | os.PathLike) -> float:
    return Path(path).stat().st_size / 2**20
