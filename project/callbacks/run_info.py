"""`RunInfo`: what a run needs to be rerun exactly, recorded beside it and in every checkpoint.

`RunInfo` writes `run_info.json` next to the run's `config.yaml` (one entry per invocation, so a resumed run
shows every segment), saves uncommitted changes as `code-N.patch`, records the same facts in the loggers (the
W&B run's config: `run_info`) and in every checkpoint (`checkpoint["run_info"]`, with the run's settings and the
W&B run id that `--ckpt_path last` resumes).
"""

import json
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from project.atomic_files import atomic_write_text
from project.redaction import redact_command

REPO = Path(__file__).resolve().parent.parent
KEY_PACKAGES = (
    "torch",
    "torchvision",
    "lightning",
    "torchmetrics",
    "jsonargparse",
    "wandb",
    "numpy",
    "pillow",
)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def code_version() -> dict[str, Any]:
    """{'commit', 'dirty', 'diff'} of the template's git checkout; commit None outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "diff": ""}
    diff = _git("diff", "HEAD", "--binary") or ""
    return {"commit": commit.strip(), "dirty": bool(diff), "diff": diff}


def package_versions() -> dict[str, str]:
    """Every installed distribution: name -> version (what `pip freeze` would pin)."""
    versions = {}
    for dist in metadata.distributions():
        name, version = name_and_version(dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "")
        if name:
            versions[name.lower()] = version
    return dict(sorted(versions.items()))


def name_and_version(core_metadata: str) -> tuple[str | None, str | None]:
    """The `Name` and `Version` fields of a distribution's METADATA text. Read from its header lines only:
    `Distribution.metadata` parses every file whole as an e-mail message (long descriptions included), which
    for a few hundred installed packages is most of what collecting a run's info costs."""
    fields: dict[str, str] = {}
    for line in core_metadata.splitlines():
        if not line:  # the header ends at the first empty line (the description follows)
            break
        key, _, value = line.partition(":")
        if key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    return fields.get("Name"), fields.get("Version")


def collect_run_info() -> dict[str, Any]:
    """Command, code version and software of this process (JSON-serialisable)."""
    versions = package_versions()
    code = code_version()
    return {
        "command": [Path(sys.executable).name, *redact_command(sys.argv)],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "git_commit": code["commit"],
        "git_dirty": code["dirty"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "key_packages": {
            **{p: versions.get(p) for p in KEY_PACKAGES},
            "torch": str(torch.__version__),
        },  # with +cuXXX
        "packages": versions,
        "_diff": code["diff"],
    }


class RunInfo(Callback):
    """Records the run's code version and software in the run folder, the loggers and each checkpoint."""

    def __init__(self) -> None:
        #: The run's settings as given, recorded in every checkpoint: what `--ckpt_path last` matches (the
        #: command sets them from its plan, project.run.resume).
        self.settings: dict[str, Any] | None = None
        self.info: dict[str, Any] | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not in `setup`: the checkpoint being resumed from (trainer.ckpt_path) is known only from here on.
        if self.info is not None:
            return
        self.info = collect_run_info()
        self.info["resumed_from"] = str(trainer.ckpt_path) if trainer.ckpt_path else None
        # trainer.log_dir is a collective (a broadcast from rank 0): every rank must ask, not only rank 0.
        run_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self.info["run_dir"] = str(run_dir.resolve())  # where `--ckpt_path last` continues the run
        self._write(run_dir)
        summary = {k: v for k, v in self.info.items() if k not in ("packages", "_diff")}
        for logger in trainer.loggers:
            logger.log_hyperparams({"run_info": summary})

    @rank_zero_only
    def _write(self, folder: Path) -> None:
        assert self.info is not None
        folder.mkdir(parents=True, exist_ok=True)
        diff = self.info["_diff"]
        entry = {k: v for k, v in self.info.items() if k != "_diff"}
        if diff:
            patch = folder / f"code-{len(_read_entries(folder))}.patch"
            atomic_write_text(patch, diff)
            entry["code_patch"] = patch.name
        entries = [*_read_entries(folder), entry]
        atomic_write_text(folder / "run_info.json", json.dumps(entries, indent=1))

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        info = {k: v for k, v in (self.info or {}).items() if k not in ("packages", "_diff")}
        info["wandb_run_id"] = next(
            (lg.version for lg in trainer.loggers if isinstance(lg, WandbLogger)), None
        )
        info["config"] = self.settings
        checkpoint["run_info"] = info


def _read_entries(folder: Path) -> list[dict[str, Any]]:
    path = folder / "run_info.json"
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return entries if isinstance(entries, list) else []
