"""The run plan: what a `fit`, `validate`, `test` or `predict` does before anything is built, decided once.

`plan_run` turns the parsed config into a `RunPlan`: the run's identity (the settings `--ckpt_path last`
matches), the checkpoint to start from (`last`/`best` resolved, a file checked), whether the command continues
an earlier run in place, the run's folder, what the checkpoint callback monitors, and the arguments each logger
is built with (its folder and version, the W&B run id and mode). Everything after reads the plan; nothing
edits the config behind it: `RunPlan.apply` returns a copy to instantiate from, and the config as given is what
the run saves as its `config.yaml` (a rerun from it is a run of its own).
"""

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch.utilities import rank_zero_only

from project.atomic_files import check_writable
from project.errors import UserError, warn
from project.loggers.wandb import wandb_mode
from project.run.checkpoints import load_checkpoint, weight_shapes
from project.run.resume import best_checkpoint, find_run_to_continue, run_settings
from project.run.run_folder import DEFAULT_ROOT_DIR, claim_run_folder, lock_run_folder, run_folder_of

SPECIAL_CKPT_PATHS = ("hpc", "registry")  # resolved by Lightning itself


@dataclass(frozen=True)
class Resume:
    """Continuing an earlier run in place (`fit --ckpt_path last`): its checkpoint, step, folder and W&B run."""

    checkpoint: Path
    step: int
    run_dir: Path | None
    wandb_id: str | None


@dataclass(frozen=True)
class RunPlan:
    """What a command does, decided before anything is instantiated (see the module docstring)."""

    subcommand: str | None  # None: the pieces only, built for a script to drive (LightningCLI's run=False)
    root: Path
    settings: dict[str, Any]
    ckpt_path: str | None
    ckpt_shapes: (
        dict[str, tuple[int, ...] | None] | None
    )  # the weights' shapes in it, checked against the model
    resume: Resume | None
    run_dir: Path | None  # this run's folder: claimed by global rank 0, None on the other processes
    monitor: (
        tuple[str, str] | None
    )  # (metric, mode) the checkpoint callback ranks by, when the config left it
    logger_args: list[dict[str, Any] | None] = field(default_factory=list)  # per logger entry of the config

    def apply(self, config: Namespace) -> Namespace:
        """A copy of the whole parsed config with the plan's decisions in it, to instantiate the run from."""
        config = config.clone()
        if self.subcommand:
            config.ckpt_path = self.ckpt_path
        if "weights_only" in config and config.weights_only is None:
            # Explicit rather than torch's default: tensors and plain values only, never arbitrary objects.
            config.weights_only = True
        checkpoint = callback_args(config, "checkpoint")
        if self.monitor is not None and checkpoint is not None:
            checkpoint.monitor, checkpoint.mode = self.monitor
        for logger, args in zip(logger_configs(config.trainer), self.logger_args, strict=True):
            if args is not None:
                logger.init_args = Namespace(**args)
        if self.run_dir is not None and not logger_configs(config.trainer):
            # Without a logger Lightning writes into default_root_dir itself: into the run's folder instead.
            config.trainer.default_root_dir = str(self.run_dir)
        return config


def plan_run(subcommand: str | None, config: Namespace, dumped: dict[str, Any], task: type | None) -> RunPlan:
    """The plan of `subcommand` for its parsed `config` (`dumped`: the same as plain YAML values; `task`: the
    LightningModule class the config names, which knows its monitored metric)."""
    # What identifies this run, as given: every checkpoint records it, and `--ckpt_path last` continues only a
    # run started with the same settings. fit continues a run started the same way; the evaluations need only
    # the same network and data.
    settings = run_settings(dumped, whole=subcommand == "fit")
    root = Path(config.trainer.default_root_dir or DEFAULT_ROOT_DIR)
    ckpt_path, resume, checkpoint = (
        resolve_ckpt_path(subcommand, config, settings, root) if subcommand else (None, None, None)
    )
    shapes = weight_shapes(checkpoint["state_dict"]) if checkpoint is not None else None
    run_dir = None
    if subcommand and rank_zero_only.rank == 0:  # the other processes of a run write nothing of their own
        check_writable(root, "trainer.default_root_dir")
        run_dir = (resume.run_dir if resume else None) or claim_run_folder(root)
        lock_run_folder(run_dir)
    checkpoint = callback_args(config, "checkpoint")
    monitor = None
    if task is not None and checkpoint is not None and checkpoint.get("monitor") is None:
        monitor = (task.monitor, task.monitor_mode)
    loggers = [logger_args(lg, root, run_dir, resume) for lg in logger_configs(config.trainer)]
    return RunPlan(subcommand, root, settings, ckpt_path, shapes, resume, run_dir, monitor, loggers)


def resolve_ckpt_path(
    subcommand: str, config: Namespace, settings: dict[str, Any], root: Path
) -> tuple[str | None, Resume | None, dict[str, Any] | None]:
    """(the checkpoint file to start from, the run it continues in place, the checkpoint as loaded) for
    `--ckpt_path`.

    A file is checked now (missing, not a checkpoint, unsafe pickle: one line). `last` is the newest intact
    checkpoint of the newest run started with these settings (see project.run.resume); `best` that run's best.
    """
    ckpt = config.get("ckpt_path")
    if ckpt is None or str(ckpt) in SPECIAL_CKPT_PATHS:
        return ckpt, None, None
    ckpt = str(ckpt)
    if ckpt not in ("last", "best"):
        return ckpt, None, load_checkpoint(ckpt)
    checkpoint_config = callback_args(config, "checkpoint")
    dirpath = checkpoint_config.get("dirpath") if checkpoint_config else None
    found = find_run_to_continue(root, dirpath, settings, whole=subcommand == "fit")
    if found is None:
        where = dirpath or f"{root} (trainer.default_root_dir)"
        if ckpt == "last" and subcommand == "fit":
            # Not an error: a job script can always pass --ckpt_path last, from its very first start.
            warn(f"--ckpt_path last: no run of these settings under {where} yet; starting a new run")
            return None, None, None
        raise UserError(f"--ckpt_path {ckpt}: no run of these settings under {where}; pass a checkpoint file")
    last, checkpoint = found
    step = int(checkpoint.get("global_step") or 0)
    path = best_checkpoint(last, checkpoint) if ckpt == "best" else last
    print(f"--ckpt_path {ckpt}: {path} (step {step})")
    if ckpt == "best":
        return str(path), None, load_checkpoint(path)
    if subcommand != "fit":
        return str(last), None, checkpoint
    info = checkpoint.get("run_info") or {}
    recorded = Path(info["run_dir"]) if info.get("run_dir") else None
    # The folder of the run that wrote it; recorded too, for checkpoints kept elsewhere (checkpoint.dirpath).
    run_dir = run_folder_of(last) or (recorded if recorded is not None and recorded.is_dir() else None)
    return str(last), Resume(last, step, run_dir, info.get("wandb_run_id")), checkpoint


def callback_args(config: Namespace, key: str) -> Namespace | None:
    """The arguments of the default callback under `key` (`checkpoint`: configs/callbacks/default.yaml) in a parsed
    config; None when the config has it off (`--checkpoint null`) or the parser does not know the key."""
    callback = config.get(key)
    return callback.get("init_args", Namespace()) if isinstance(callback, Namespace) else None


def logger_configs(trainer_config: Any) -> list[Any]:
    """The logger entries of a trainer config as a list (the config allows one, a list, or a bool)."""
    loggers = trainer_config.logger
    if isinstance(loggers, list):
        return loggers
    return [] if loggers in (None, True, False) else [loggers]


def logger_args(
    logger: Any, root: Path, run_dir: Path | None, resume: Resume | None
) -> dict[str, Any] | None:
    """The init arguments one configured logger is built with: the config's, plus the run's folder and ids."""
    init_args = getattr(logger, "init_args", None)
    if init_args is None:
        return None
    args = dict(init_args)
    if str(args.get("save_dir")) == DEFAULT_ROOT_DIR:  # loggers left at the default follow default_root_dir
        args["save_dir"] = str(root)
    if str(logger.class_path).endswith("WandbLogger"):
        args |= wandb_mode(args)
        if resume and resume.wandb_id and not args.get("id") and not args.get("version"):
            args["id"] = resume.wandb_id  # WandbLogger always passes resume="allow": the run continues
    elif "version" in args and args.get("version") is None and run_dir is not None:
        # Versioned loggers (CSV, TensorBoard) writing into the runs folder take this run's version_N.
        parent = Path(str(args.get("save_dir") or ".")) / str(args.get("name") or "")
        with contextlib.suppress(OSError):
            if parent.resolve() == run_dir.resolve().parent:
                args["version"] = run_dir.name
    return args


def check_accelerator(accelerator: Any) -> None:
    """A UserError, naming the CPU presets, when the config asks for a GPU and this machine has none."""
    if str(accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            f"trainer.accelerator {accelerator}: this machine has no CUDA GPU (torch.cuda.is_available() is "
            "False). Train on the CPU with --trainer.accelerator cpu; for distributed training on CPUs stack "
            "configs/trainer/ddp_cpu.yaml or configs/trainer/fsdp2_cpu.yaml instead of the GPU presets "
            "(ddp.yaml, fsdp.yaml, fsdp2.yaml)"
        )


def precision_for_this_machine(precision: Any) -> Any:
    """`16-mixed` without a GPU becomes `32-true`, with one notice: Lightning would fall back to bf16, which
    CPUs without native bf16 emulate, slowly. The GPU recipes' precision thus runs as well as it can anywhere."""
    if str(precision) in ("16-mixed", "16") and not torch.cuda.is_available():
        warn(f"trainer.precision {precision} needs a CUDA GPU; training in 32-true on this CPU")
        return "32-true"
    return precision
