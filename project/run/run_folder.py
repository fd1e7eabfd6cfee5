"""Where a run's files go: one folder per run under `trainer.default_root_dir`, written by one process at a time.

Everything of a run lives in `<root>/runs/version_N/`: its config, run info, metrics, predictions and
`checkpoints/`, whatever the loggers (with `logger: false` too). A new run claims the next free `version_N`
with an atomic `mkdir`, so two runs started at once into the same root never share a folder; and a run holds
an exclusive lock on its folder while it runs, so a second process cannot resume, or write into, a run that
is still going. The kernel releases the lock when the process ends, however it ends.
"""

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

from project.errors import UserError

DEFAULT_ROOT_DIR = "logs"
RUNS = "runs"
_held: list[Any] = []  # open lock files: closing one releases its lock
_claimed: list[Path] = []  # folders this process created: removed again if the run wrote nothing into them


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint was written in (`<run>/checkpoints/x.ckpt`), or None for a loose file."""
    return checkpoint.resolve().parent.parent if checkpoint.parent.name == "checkpoints" else None


def claim_run_folder(root: str | Path) -> Path:
    """Create and return the next free `<root>/runs/version_N` (an atomic mkdir: no two processes get one)."""
    runs = Path(root) / RUNS
    _claimed.extend(p for p in (runs, *runs.parents) if not p.exists())
    runs.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name.removeprefix("version_")) for p in runs.glob("version_*") if p.name[8:].isdigit()]
    n = max(taken, default=-1) + 1
    while True:
        try:
            (runs / f"version_{n}").mkdir()
            _claimed.append(runs / f"version_{n}")
            return runs / f"version_{n}"
        except FileExistsError:  # another run claimed it between the listing and the mkdir
            n += 1


def lock_path(run_dir: Path) -> Path:
    """The lock file of a run folder: beside it (`runs/.version_N.lock`), so the folder itself starts empty."""
    return run_dir.with_name(f".{run_dir.name}.lock")


def lock_run_folder(run_dir: Path) -> None:
    """Hold an exclusive lock on `run_dir` until this process ends; a UserError if another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    file = open(lock_path(run_dir), "a+")  # noqa: SIM115 - kept open for the life of the process: it is the lock
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise UserError(
            f"the run in {run_dir} is still running ({holder}): wait for it to end, or start a separate run "
            "(without --ckpt_path last, or with another --trainer.default_root_dir)"
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    file.flush()
    _held.append(file)


def release_run_folders() -> None:
    """Release the locks this process holds, and remove the folders it claimed but wrote nothing into (a
    command that stopped at a bad setting leaves no trace)."""
    while _held:
        with contextlib.suppress(OSError):
            _held.pop().close()
    for folder in sorted(_claimed, key=lambda p: len(p.parts), reverse=True):  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()  # only if empty: a folder the run wrote into stays
            lock_path(folder).unlink(missing_ok=True)
    _claimed.clear()
