"""`--ckpt_path last|best`: find the run to continue, and continue it in place.

Lightning looks for `last.ckpt` only in the folder of the run being started, which is always a new, empty
`version_N`, so with Lightning alone `--ckpt_path last` would silently start from scratch. Here `last` is the
newest intact checkpoint of the newest run under `trainer.default_root_dir` (or in `checkpoint.dirpath` when
set) that was started with the same settings: every checkpoint records the run's config, and a run started
otherwise (a debug run, another network) is passed over with a notice naming the first setting that differs.
Only the length of training (`trainer.max_epochs`, `max_steps`, `max_time`) may change, to train longer.
`best` is the best checkpoint recorded in that run. Resuming from `last` continues the same run: its
`version_N` folder (checkpoints, best-k tracking, `metrics.csv` kept up to the checkpoint's step) and its W&B
run id. An explicit path starts a new run folder from that state instead (a branch, e.g. to fine-tune).
"""

import csv
import os
import re
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger

from project.errors import UserError, warn
from project.lightning_private import restore_csv_rows
from project.redaction import redact_config
from project.run.checkpoints import load_checkpoint
from project.run.run_folder import RUNS

LAST_NAME = re.compile(r"^last(-v\d+)?\.ckpt$")  # Lightning versions clashing names as last-v1.ckpt, ...
#: Settings that may differ between a run and the command that continues it: how long to train, and whether
#: the fit tests its best checkpoint at the end.
MAY_CHANGE = ("ckpt_path", "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "test_after_fit")
#: Data settings that say how the images are read or which ones to evaluate and predict, not what the model
#: learned from: `--ckpt_path best` finds a run's best checkpoint whatever they are.
HOW_DATA_IS_READ = frozenset(
    ("predict_root", "predict_csv", "test_csv", "skip_corrupt", "batch_size", "num_workers",
     "prefetch_factor", "pin_memory", "persistent_workers", "cache", "cache_dir", "on_device",
     "max_cache_size", "predict_split")
)  # fmt: skip


def run_settings(config: dict[str, Any], whole: bool = True) -> dict[str, Any]:
    """The settings that identify a run: its config without the keys that may change on resume; or, for
    evaluating it (`whole=False`), its network and data alone. Secrets are left out (`redact_config`): every
    checkpoint records these."""
    return redact_config(_run_settings(config, whole))


def _run_settings(config: dict[str, Any], whole: bool) -> dict[str, Any]:
    if not whole:
        data = dict(config.get("data") or {})
        if isinstance(data.get("init_args"), dict):
            data["init_args"] = {k: v for k, v in data["init_args"].items() if k not in HOW_DATA_IS_READ}
        return {"model": config.get("model"), "data": data}
    settings = {key: value for key, value in config.items() if key not in MAY_CHANGE}
    trainer = {k: v for k, v in (settings.get("trainer") or {}).items() if f"trainer.{k}" not in MAY_CHANGE}
    return {**settings, "trainer": trainer}


def first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The first dotted key whose value differs between two nested configs, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if a == b else f"{prefix.rstrip('.')}: {a!r} there, {b!r} here"


def checkpoints_newest_first(folder: Path, recursive: bool = False) -> list[Path]:
    """The checkpoint files in `folder` (and below it), newest first; hidden partial files are never one."""
    found = folder.rglob("*.ckpt") if recursive else folder.glob("*.ckpt")
    files = [p for p in found if p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def find_last_checkpoint(root: str | Path, dirpath: str | Path | None = None) -> Path | None:
    """The most recently written `last*.ckpt` in `dirpath`, else anywhere under `root`; None if there is none."""
    folder = Path(dirpath) if dirpath else Path(root)
    if not folder.is_dir():
        return None
    return next((p for p in checkpoints_newest_first(folder, not dirpath) if LAST_NAME.match(p.name)), None)


def find_run_to_continue(
    root: str | Path, dirpath: str | Path | None, settings: dict[str, Any], whole: bool = True
) -> tuple[Path, dict[str, Any]] | None:
    """(newest intact checkpoint, its content) of the newest run started with `settings`; None if no run was.

    Runs are the folders of `root/runs/`, or `dirpath` alone when given; each is judged by its newest
    checkpoint's recorded config (checkpoints written before configs were recorded match any command), read
    as `run_settings(config, whole)` reads the command's.
    A checkpoint that cannot be read (cut short by a full disk, say) is skipped for the next one of its run.
    """
    if dirpath:
        folders = [Path(dirpath)] if Path(dirpath).is_dir() else []
    else:
        base = Path(root) / RUNS
        folders = [p / "checkpoints" for p in base.glob("version_*") if (p / "checkpoints").is_dir()]
    runs = [(files, folder) for folder in folders if (files := checkpoints_newest_first(folder))]
    runs.sort(key=lambda run: run[0][0].stat().st_mtime_ns, reverse=True)
    passed_over = None
    for files, folder in runs:
        for path in files:
            try:
                checkpoint = load_checkpoint(path)
            except UserError as e:
                warn(f"--ckpt_path last: skipping {path}: {e}")
                continue
            recorded = (checkpoint.get("run_info") or {}).get("config")
            if recorded is not None:
                recorded = run_settings(recorded, whole)
                recorded = {key: recorded.get(key) for key in settings}
            difference = recorded is not None and first_difference(recorded, settings)
            if difference:
                passed_over = passed_over or (folder.parent, difference)
                break  # the whole run was started otherwise
            if passed_over:
                warn(
                    f"--ckpt_path last: {_passing_over(*passed_over)}; continuing the run in {folder.parent}"
                )
            return path, checkpoint
    if passed_over:
        run = passed_over[0]
        warn(
            f"--ckpt_path last: {_passing_over(*passed_over)}; to continue it anyway, pass its checkpoint: "
            f"--ckpt_path {run}/checkpoints/last.ckpt"
        )
    return None


def _passing_over(run: Path, difference: str) -> str:
    return f"passing over the run in {run}, started with other settings ({difference})"


def best_checkpoint(last: Path, checkpoint: dict[str, Any]) -> Path:
    """The best checkpoint recorded by the ModelCheckpoint state inside `checkpoint` (loaded from `last`)."""
    for key, state in checkpoint.get("callbacks", {}).items():
        best = state.get("best_model_path") if isinstance(state, dict) else None
        if "Checkpoint" in key and best:
            if not Path(best).is_file():
                raise UserError(
                    f"--ckpt_path best: {last} names {best} as the best checkpoint, but it does not exist"
                )
            return Path(best)
    raise UserError(f"--ckpt_path best: {last} records no best checkpoint (was a metric monitored?)")


def keep_csv_metrics(logger: CSVLogger, before_step: int) -> None:
    """Continue `logger`'s existing metrics.csv instead of letting it be deleted, keeping rows logged before
    `before_step` (rows after the checkpoint are logged again by the resumed run).

    Lightning's CSV writer deletes an existing metrics.csv when it starts. The file is first renamed aside
    (atomic), so a kill at any point leaves the rows on disk; a later resume picks them up from there.
    """
    path = Path(logger.log_dir) / "metrics.csv"
    aside = path.with_name(".metrics.csv.resume")
    if path.exists():
        os.replace(path, aside)
    if not aside.exists():
        return
    with open(aside, newline="") as f:
        reader = csv.DictReader(f)
        keys = list(reader.fieldnames or [])
        rows = [row for row in reader if _step(row) < before_step]
    with warnings.catch_warnings():  # "will be deleted": not true here, the rows are written back below
        warnings.filterwarnings("ignore", message=".*Previous log files in this directory will be deleted")
        restore_csv_rows(logger, keys, [{k: v for k, v in row.items() if v != ""} for row in rows])
    aside.unlink()


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or 0)
    except ValueError:
        return 0.0
