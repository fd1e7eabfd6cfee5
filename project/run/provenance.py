"""What a run needs to be rerun exactly: its config, the code, the software and the random state.

`LoggerSaveConfigCallback` writes the resolved config, `config.yaml`, beside the run (atomically) and records it
in every logger (the W&B run's config).

`RunInfo` writes `run_info.json` next to the run's `config.yaml` (one entry per invocation, so a resumed run
shows every segment), saves uncommitted changes as `code-N.patch`, records the same facts in the loggers (the
W&B run's config: `run_info`) and in every checkpoint (`checkpoint["run_info"]`, with the W&B run id that
`--ckpt_path last` resumes).

`RNGState` carries every process's global random generators in every checkpoint. Lightning restores the model, optimizer,
schedulers, loops and callbacks on resume, but not the generators: a resumed run would restart them from
`seed_everything` and shuffle and augment the next epochs differently from the run it continues.
"""

import json
import platform
import random
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from project.atomic_files import atomic_write_text
from project.run.redaction import redact_command

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


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config next to the run (config.yaml, atomically) and records it in every logger (W&B's
    run config)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.already_saved:
            log_dir = trainer.log_dir  # a collective (broadcast from rank 0): every rank asks
            if trainer.is_global_zero:
                # The config as parsed (and validated then): a validating dump would check it all over again.
                text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
                atomic_write_text(Path(log_dir) / self.config_filename, text)
        super().setup(trainer, pl_module, stage)  # save_to_log_dir=False: the loggers' copy only

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        config = self.config.as_dict()
        for logger in trainer.loggers:
            logger.log_hyperparams(config)


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

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.settings = (
            settings  # the run's config as given, recorded in checkpoints (see project.run.resume)
        )
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


def collect_rng_states() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and Python generator states, as tensors and plain values only, so the
    checkpoint still loads with `weights_only=True`."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy tuple: ("MT19937", keys, pos, has_gauss, gauss)
    version, state, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "python": {"version": version, "state": list(state), "gauss": python_gauss},
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Inverse of `collect_rng_states`. CUDA states are restored only onto the same number of devices."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("torch.cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = states["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = states["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def gather_by_rank(states: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Every process's `states`, keyed by global rank (a collective: every process calls it at the same point)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {0: states}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, states)
    return dict(enumerate(gathered))


class RNGState(Callback):
    """Saves every process's global RNG states in each checkpoint; each restores its own when training resumes.

    The states are applied at `on_fit_start`: after the model is built and the checkpoint is read, and before
    Lightning creates the first training iterator, with nothing random in between (the sanity check runs in
    `isolate_rng`; loaders seed their workers from a generator of their own and the training order is a
    function of the seed and the epoch, see `project.data.samplers`). The on-device augmentation draws from
    the global generator of the batch's device (CPU, or each CUDA device's), which these states include, so a
    resumed run draws exactly the numbers the uninterrupted run draws, in the same order. A process whose rank
    the checkpoint has no state for (a run continued on more processes) takes rank 0's.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Lightning asks every process for its callbacks' states as it writes a checkpoint (rank 0 writes it).
        return {"ranks": gather_by_rank(collect_rng_states())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is None:
            return
        by_rank = self._pending.get("ranks", {0: self._pending})  # a checkpoint from before per-rank states
        set_rng_states(by_rank.get(trainer.global_rank, by_rank[0]))
        self._pending = None
