"""`--ckpt_path last|best`: find the checkpoint, and continue the interrupted run in place.

Lightning looks for `last.ckpt` only in the folder of the run being started, which is always a new, empty
`version_N`, so with Lightning alone `--ckpt_path last` would silently start from scratch. Here `last` is the newest `last.ckpt` under
`trainer.default_root_dir` (or `checkpoint.dirpath` when set), and `best` is the best checkpoint recorded in it.
Resuming from `last` continues the same run: its `version_N` folder (checkpoints, best-k tracking,
`metrics.csv` kept up to the checkpoint's step) and its W&B run id. An explicit path starts a new run folder
from that state instead (a branch, e.g. to fine-tune).
"""

import csv
import os
import re
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger

from project.errors import UserError
from project.run.lightning_private import restore_csv_rows

LAST_NAME = re.compile(r"^last(-v\d+)?\.ckpt$")  # Lightning versions clashing names as last-v1.ckpt, ...


def find_last_checkpoint(root: str | Path, dirpath: str | Path | None = None) -> Path | None:
    """The most recently written `last*.ckpt` in `dirpath`, else anywhere under `root`; None if there is none."""
    folder = Path(dirpath) if dirpath else Path(root)
    if not folder.is_dir():
        return None
    found = folder.glob("*.ckpt") if dirpath else folder.rglob("*.ckpt")
    candidates = [p for p in found if LAST_NAME.match(p.name) and p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime_ns) if candidates else None


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


def continue_run(loggers: list[Any], ckpt: Path, checkpoint: dict[str, Any]) -> Path | None:
    """Point the configured loggers at the run that wrote `ckpt` (`<save_dir>/<name>/<version>/checkpoints/`).

    Versioned loggers (CSV, TensorBoard) whose folder matches get that version; W&B loggers get the run id
    recorded in the checkpoint (`run_info.wandb_run_id`). Returns the run folder when a
    versioned logger was matched (its metrics are then kept up to the checkpoint's step).
    """
    run_dir = ckpt.resolve().parent.parent if ckpt.parent.name == "checkpoints" else None
    wandb_id = (checkpoint.get("run_info") or {}).get("wandb_run_id")
    matched = None
    for logger in loggers:
        init_args = getattr(logger, "init_args", None)
        if init_args is None:
            continue
        if logger.class_path.endswith("WandbLogger"):
            if wandb_id and not init_args.get("id") and not init_args.get("version"):
                init_args["id"] = wandb_id  # WandbLogger always passes resume="allow": the run continues
            continue
        if run_dir is None or "version" not in init_args or init_args.get("version") is not None:
            continue
        parent = Path(str(init_args.get("save_dir") or ".")) / str(init_args.get("name") or "")
        if parent.resolve() == run_dir.parent:
            init_args["version"] = run_dir.name
            matched = run_dir
    return matched


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
