"""`ReliableRunMixin`: what makes a `python -m project` run survive kills and fail clearly.

Mixed into ProjectCLI (before LightningCLI), it adds, for every subcommand:
  - checkpoints written atomically (`AtomicCheckpointIO`), RNG states and run info in every checkpoint;
  - `--ckpt_path last|best` resolved under `trainer.default_root_dir`; `fit --ckpt_path last` continues the
    interrupted run in place (same `version_N` folder, metrics, best-k tracking and W&B run id);
  - a checkpoint path checked before anything starts (missing, not a checkpoint, unsafe pickle: one line);
  - checkpoints loaded with `weights_only=True` by default (`--weights_only` on each subcommand);
  - a checkpoint that does not fit the network reported with the mismatched keys and shapes;
  - an output folder that cannot be written reported before anything starts;
  - online W&B without a network or login falling back to offline logging, with a notice.
"""

import re
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from project.errors import UserError, warn
from project.io import check_writable
from project.run.checkpoints import load_checkpoint, load_weights, with_atomic_checkpoint_io
from project.run.interrupts import CtrlCStopsAfterTheBatch
from project.run.provenance import RNGState, RunInfo
from project.run.resume import (
    LogsBeforeCheckpoints,
    best_checkpoint,
    continue_run,
    find_run_to_continue,
    keep_csv_metrics,
    run_settings,
)
from project.run.run_folder import (
    DEFAULT_ROOT_DIR,
    claim_run_folder,
    follow_root_dir,
    lock_run_folder,
    logger_configs,
    point_loggers_at,
    release_run_folders,
)
from project.run.wandb_logger import apply_wandb_mode, fall_back_to_offline

# Messages of torch layers fed a tensor of the wrong shape (linear, conv channels, too small for pooling).
SHAPE_ERROR = re.compile(
    r"shapes cannot be multiplied|channels, but got|Calculated padded input size|Output size is too small"
)
SPECIAL_CKPT_PATHS = ("hpc", "registry")  # resolved by Lightning itself


def config_files(args: Any) -> list[str]:
    """The values of `--config`/`-c` in a command line (a list of strings; other forms are left to the parser)."""
    if not isinstance(args, list | tuple):
        return []
    args = [str(a) for a in args]
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    return found + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def check_config_file(path: str) -> None:
    """A UserError naming `path` when it cannot be read or is not valid YAML (jsonargparse names neither)."""
    file = Path(path)
    if not file.exists():
        return  # the parser's own message names the missing file
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {file}: {getattr(e, 'strerror', None) or e}") from None
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UserError(
            f"config file {file} is not valid YAML{where}: {getattr(e, 'problem', None) or e}"
        ) from None


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


def _short_usage(parser: Any, file: Any = None) -> None:
    (file or sys.stderr).write(f"usage: {parser.prog} [--config CONFIG] [--KEY VALUE ...]\n")


class ReliableRunMixin:
    """LightningCLI hooks for safe checkpoints, in-place resume and clear errors; see the module docstring."""

    _resume: tuple[Path, dict[str, Any]] | None = None  # (last.ckpt, its run_info and global_step)
    _resume_run_dir: Path | None = None
    _run_dir: Path | None = None  # this run's folder (global rank 0)
    _settings: dict[str, Any] = {}
    _logger_args: list[tuple[Any, dict[str, Any]]] = []

    # -- parsing -------------------------------------------------------------------------------------------
    def init_parser(self, **kwargs: Any) -> Any:
        parser = super().init_parser(**kwargs)
        # jsonargparse prints the full usage (hundreds of options) above a parse error; one line is enough,
        # with its tip to run --help and the error itself.
        parser.print_usage = types.MethodType(_short_usage, parser)
        return parser

    def parse_arguments(self, parser: Any, args: Any) -> None:
        for path in config_files(sys.argv[1:] if args is None else args):
            check_config_file(path)
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:
            # What identifies this run, as given (before any logger is pointed at a folder): every checkpoint
            # records it, and `--ckpt_path last` continues only a run started with the same settings.
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False, skip_link_targets=False))
            # fit continues a run started the same way; the evaluations need only the same network and data.
            self._settings = run_settings(dumped[subcommand], whole=subcommand == "fit")
        if subcommand and self.config[subcommand].get("ckpt_path") is not None:
            # Before Lightning reads the checkpoint's hyperparameters into the model config.
            self._resolve_ckpt_path(subcommand, self.config[subcommand])

    def subcommand_defaults(self, subcommand: str, method_arguments: list[str]) -> dict[str, Any]:
        defaults = super().subcommand_defaults(subcommand, method_arguments)
        if "weights_only" in method_arguments:
            # Explicit rather than torch's default: tensors and plain values only, never arbitrary objects.
            defaults["weights_only"] = True
        return defaults

    def _resolve_ckpt_path(self, subcommand: str, config: Any) -> None:
        ckpt = str(config.ckpt_path)
        if ckpt in SPECIAL_CKPT_PATHS:
            return
        if ckpt not in ("last", "best"):
            load_checkpoint(ckpt)  # UserError: missing, not a checkpoint, or objects that could run code
            return
        root = config.trainer.default_root_dir or DEFAULT_ROOT_DIR
        dirpath = config.get("checkpoint", {}).get("dirpath") if config.get("checkpoint") else None
        found = find_run_to_continue(root, dirpath, self._settings)
        if found is None:
            where = dirpath or f"{root} (trainer.default_root_dir)"
            if ckpt == "last" and subcommand == "fit":
                # Not an error: a job script can always pass --ckpt_path last, from its very first start.
                warn(f"--ckpt_path last: no run of these settings under {where} yet; starting a new run")
                config.ckpt_path = None
                return
            raise UserError(
                f"--ckpt_path {ckpt}: no run of these settings under {where}; pass a checkpoint file"
            )
        last, checkpoint = found
        if ckpt == "best":
            path = best_checkpoint(last, checkpoint)
            load_checkpoint(path)
        else:
            path = last
            if subcommand == "fit":
                self._resume = (last, {k: checkpoint.get(k) for k in ("run_info", "global_step")})
        config.ckpt_path = str(path)
        print(f"--ckpt_path {ckpt}: {path} (step {checkpoint.get('global_step')})")

    # -- instantiation -------------------------------------------------------------------------------------
    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        config = self.config[self.subcommand] if self.subcommand else self.config
        loggers = logger_configs(config.trainer)
        follow_root_dir(loggers, config.trainer.default_root_dir or DEFAULT_ROOT_DIR)
        apply_wandb_mode(loggers)
        fall_back_to_offline(loggers)
        if self.subcommand is None:
            return
        root = config.trainer.default_root_dir or DEFAULT_ROOT_DIR
        check_writable(root, "trainer.default_root_dir")
        # The loggers are pointed at this run's folder and W&B id for their instantiation only: the saved config
        # keeps them unset, so a rerun from it becomes a run of its own (see after_instantiate_classes).
        self._logger_args = [
            (a, dict(a)) for a in (getattr(lg, "init_args", None) for lg in loggers) if a is not None
        ]
        if self._resume is not None:
            self._resume_run_dir = continue_run(loggers, *self._resume)
        if rank_zero_only.rank == 0:  # the other processes of a run write nothing of their own
            self._run_dir = self._resume_run_dir or claim_run_folder(root)
            lock_run_folder(self._run_dir)
            point_loggers_at(loggers, self._run_dir)

    def after_instantiate_classes(self) -> None:
        super().after_instantiate_classes()
        for init_args, before in self._logger_args:
            for key in ("version", "id"):
                if key in before:
                    init_args[key] = before[key]

    def configure_trainer(self, trainer_config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        check_accelerator(trainer_config.get("accelerator"))
        trainer_config["precision"] = precision_for_this_machine(trainer_config.get("precision"))
        callbacks = super().configure_trainer(trainer_config, callbacks)
        trainer_config["plugins"] = with_atomic_checkpoint_io(trainer_config.get("plugins"))
        if self._run_dir is not None and trainer_config.get("logger") in (False, None, []):
            # Without a logger Lightning writes into default_root_dir itself: into the run's folder instead.
            trainer_config["default_root_dir"] = str(self._run_dir)
        if self.subcommand != "fit":
            return callbacks
        return [
            *callbacks,
            RNGState(),
            RunInfo(self._settings),
            LogsBeforeCheckpoints(),
            CtrlCStopsAfterTheBatch(),
        ]

    # -- running -------------------------------------------------------------------------------------------
    def before_fit(self) -> None:
        if self._resume_run_dir is None or not self.trainer.is_global_zero:
            return
        # Lightning warns about the run's own checkpoint folder being non-empty: expected when continuing it.
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        step = int(self._resume[1].get("global_step") or 0)
        for logger in self.trainer.loggers:
            if isinstance(logger, CSVLogger) and Path(logger.log_dir).resolve() == self._resume_run_dir:
                keep_csv_metrics(logger, before_step=step)

    def run_subcommand(self, subcommand: str, run: Callable[[], None]) -> None:
        try:
            super().run_subcommand(subcommand, run)
            self._say_if_nothing_was_trained(subcommand)
        except RuntimeError as e:
            ckpt = self.config_init[subcommand].get("ckpt_path")
            if "Error(s) in loading state_dict" in str(e) and ckpt and self.model is not None:
                # Lightning's message is a wall of keys: say which keys and shapes differ, in one line.
                load_weights(self.model, load_checkpoint(ckpt)["state_dict"], source=f"checkpoint {ckpt}")
            if SHAPE_ERROR.search(str(e)):
                shape = getattr(self.datamodule, "input_shape", None)
                raise UserError(
                    f"the network does not fit its input: {str(e).splitlines()[0]}. The data gives images of "
                    f"shape {shape}: check the network's settings (input_shape, channels) against the data's "
                    "(data.image_size)."
                ) from e
            raise
        finally:
            release_run_folders()  # the run has written what it writes

    def _say_if_nothing_was_trained(self, subcommand: str) -> None:
        if subcommand == "fit" and self._resume is not None and self.trainer.is_global_zero:
            step = int(self._resume[1].get("global_step") or 0)
            if self.trainer.global_step == step:
                warn(
                    f"--ckpt_path last: the run in {self._resume_run_dir} had already reached the end of its "
                    f"training (step {step}); nothing was trained. To train longer, raise --trainer.max_epochs"
                )
