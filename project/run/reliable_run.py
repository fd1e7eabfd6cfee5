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

import yaml
from lightning.pytorch.loggers import CSVLogger

from project.errors import UserError
from project.io import check_writable
from project.run.checkpoints import load_checkpoint, load_weights, with_atomic_checkpoint_io
from project.run.provenance import RNGState, RunInfo
from project.run.resume import best_checkpoint, continue_run, find_last_checkpoint, keep_csv_metrics
from project.run.run_folder import DEFAULT_ROOT_DIR, follow_root_dir, logger_configs
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


def _short_usage(parser: Any, file: Any = None) -> None:
    (file or sys.stderr).write(f"usage: {parser.prog} [--config CONFIG] [--KEY VALUE ...]\n")


class ReliableRunMixin:
    """LightningCLI hooks for safe checkpoints, in-place resume and clear errors; see the module docstring."""

    _resume: tuple[Path, dict[str, Any]] | None = None  # (last.ckpt, its run_info and global_step)
    _resume_run_dir: Path | None = None

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
        last = find_last_checkpoint(root, dirpath)
        if last is None:
            where = dirpath or f"{root} (trainer.default_root_dir)"
            if ckpt == "last" and subcommand == "fit":
                # Not an error: a job script can always pass --ckpt_path last, from its very first start.
                warnings.warn(
                    f"--ckpt_path last: no last.ckpt under {where} yet; starting a new run", stacklevel=2
                )
                config.ckpt_path = None
                return
            raise UserError(
                f"--ckpt_path {ckpt}: there is no last.ckpt under {where}; pass a checkpoint file"
            )
        checkpoint = load_checkpoint(last)
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
        if self.subcommand in ("fit", "predict") or loggers:  # predictions, checkpoints and logs go there
            check_writable(config.trainer.default_root_dir or DEFAULT_ROOT_DIR, "trainer.default_root_dir")
        if self._resume is not None:
            self._resume_run_dir = continue_run(loggers, *self._resume)

    def configure_trainer(self, trainer_config: dict[str, Any], callbacks: list[Any]) -> list[Any]:
        callbacks = super().configure_trainer(trainer_config, callbacks)
        trainer_config["plugins"] = with_atomic_checkpoint_io(trainer_config.get("plugins"))
        return [*callbacks, RNGState(), RunInfo()] if self.subcommand == "fit" else callbacks

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
