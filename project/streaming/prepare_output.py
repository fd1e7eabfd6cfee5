"""What keeps the output of `python -m project prepare` safe: a prepare never removes what it did not write.

A local output is written into a hidden staging folder beside it (`.NAME.prepare-<pid>`, holding the
`.prepare-incomplete` marker) and swapped in whole at the end, under a lock file beside it
(`.NAME.prepare.lock`): a prepare that fails, or is stopped, leaves the output as it was, and a second prepare
into the same folder is refused while the first runs. Only a new or empty folder is written, or, with
--overwrite, a folder holding a dataset prepare made; never a folder that is, contains or lies inside the input.
The marker, the claim on what an output holds and the one-line write errors serve an s3:// output as well
(project.streaming.prepare_bucket).
"""

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from project.atomic_files import _alive, fsync_folder, no_space_left
from project.errors import UserError
from project.streaming.metadata import FORMAT, METADATA, hide_password

#: The file (in a local staging folder) or key (under an s3:// prefix) marking an unfinished prepare's output.
INCOMPLETE = ".prepare-incomplete"
#: The settings of a source naming folders it reads, and files whose folder it reads.
INPUT_FOLDERS = ("root", "images")
INPUT_FILES = ("csv", "val_csv", "test_csv")
#: An OS error as a worker's traceback (which litdata raises as a RuntimeError) ends with it.
_OS_ERROR_LINE = re.compile(r"(?:\w+Error): \[Errno (\d+)\] ([^\n]*)")


def is_prepared(folder: Path) -> bool:
    return _is_own_metadata(folder / METADATA)


def _is_own_metadata(path: Path) -> bool:
    """Whether `path` is the metadata of a dataset this version of prepare made (valid JSON, its format)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def input_folders(data_config: Any, prefix: str = "data") -> dict[str, Path]:
    """The folders a source's config reads (what names each -> the folder, resolved): its own folders, those of
    its CSV files, the folder torchvision reads CIFAR from inside data_dir, and those of the source a DataModule
    holds (`data.source`, a class of its own: any of its settings naming an existing file or folder)."""
    settings = getattr(data_config, "init_args", None)
    if settings is None:
        return {}
    found: dict[str, Path] = {}
    for key in (*INPUT_FOLDERS, *INPUT_FILES):
        if value := settings.get(key):
            path = Path(str(value)).expanduser().resolve()
            found[f"{prefix}.{key}" if key in INPUT_FOLDERS else f"{prefix}.{key}'s folder"] = (
                path.parent if key in INPUT_FILES else path
            )
    if prefix != "data":  # a source's settings: whatever names a file or folder is read from
        for key, value in vars(settings).items():
            path = Path(str(value)).expanduser() if isinstance(value, str | Path) and value else None
            if key not in (*INPUT_FOLDERS, *INPUT_FILES) and path is not None and path.exists():
                found[f"{prefix}.{key}" if path.is_dir() else f"{prefix}.{key}'s folder"] = (
                    path.resolve() if path.is_dir() else path.resolve().parent
                )
    if source := settings.get("source"):
        found |= input_folders(source, f"{prefix}.source")
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


def claim(state: str, shown: str, overwrite: bool) -> None:
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


def local_state(out: Path) -> str:
    """What the local output `out` holds (see `claim`)."""
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
def writing(shown: str, url: str | None = None) -> Iterator[None]:
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
def locked(out: Path, shown: str) -> Iterator[None]:
    """Hold the lock file beside `out` for the block; a UserError when a live process holds it. A lock whose
    process is gone (killed outright) is taken over."""
    lock = out.with_name(f".{out.name}.prepare.lock")
    for _ in range(2):
        with writing(shown):
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


def fsync_tree(folder: Path) -> None:
    """Flush every file under `folder` to disk, so that the dataset swapped in survives a power cut whole."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for path in (folder, *(p for p in folder.rglob("*") if p.is_dir())):
        fsync_folder(path)


def swap_in(staging: Path, out: Path) -> None:
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
