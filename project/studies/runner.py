"""What `cv` and `tune` share: their command lines, the `fit` subprocess and resumable folders (their result
tables are project.studies.tables).

A study's command line is the tool's own flags plus everything else, which goes to every `fit` unchanged (in
its order: later `--config` files and flags win, as in `fit`). Each fit runs as `python -m project fit` in
its own folder (`--trainer.default_root_dir`). A killed study leaves each folder either complete (its result
file, written last and atomically, exists) or resumable; the study folder records the settings it was
started with, so a rerun with other settings cannot mix its runs into it.
"""

import contextlib
import ctypes
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from project import PACKAGE
from project.atomic_files import atomic_write_text
from project.callbacks.interrupts import STUDY_RUN_ENV
from project.errors import UserError
from project.run.plan import callback_args

SETTINGS_FILE = "settings.json"
#: Forwarded flags the study sets itself for every fit.
RESERVED = ("--ckpt_path", "--test_after_fit")


class FitFailed(UserError):
    """A fit subprocess ended without finishing; the message names the run and its folder."""


# -- command lines -----------------------------------------------------------------------------------------
def parse_fit_args(fit_args: Sequence[str]) -> tuple[Any, Namespace]:
    """(the `fit` parser, the parsed config) of the arguments a study passes to every fit: a bad file, key or
    value is a UserError naming it, before any fit starts."""
    from project.cli.config import parse_fit_args as parse  # LightningCLI's stack: only for the studies

    for flag in RESERVED:
        if any(str(a).split("=", 1)[0] == flag for a in fit_args):
            raise UserError(f"{flag} is set by the study for every run it starts; leave it out")
    return parse(fit_args)


def config_stem(fit_args: Sequence[str], default: str) -> str:
    """The file name (without suffix) of the last `--config` given, the default name of a study."""
    configs = [fit_args[i + 1] for i, a in enumerate(fit_args[:-1]) if a in ("--config", "-c")]
    configs += [a.split("=", 1)[1] for a in fit_args if a.startswith("--config=")]
    return Path(configs[-1]).stem if configs else default


# -- checks before any fit ----------------------------------------------------------------------------------
def check_produces_metric(config: Namespace, what: str, metric: str, needs_best_checkpoint: bool) -> None:
    """A UserError naming the first setting under which no fit of the study could produce `metric`, or with
    `needs_best_checkpoint` the best checkpoint and `last.ckpt` the study reads it from: before any fit runs,
    instead of a failure after the first one has trained."""
    trainer = config.trainer
    why = f"so no run of {what} would produce its {metric}"
    for key in ("limit_train_batches", "limit_val_batches", "max_epochs", "max_steps"):
        value = trainer.get(key)
        if value is not None and not isinstance(value, bool) and value == 0:
            raise UserError(f"trainer.{key}={value}: the runs would never validate, {why}")
    every, epochs = trainer.get("check_val_every_n_epoch"), trainer.get("max_epochs")
    if every is not None and epochs is not None and epochs != -1 and every > epochs:
        raise UserError(
            f"trainer.check_val_every_n_epoch={every} with trainer.max_epochs={epochs}: the runs would never "
            f"validate, {why}"
        )
    if not needs_best_checkpoint:
        return
    checkpoint = callback_args(config, "checkpoint") or Namespace()
    uses = f"{what} evaluates each run's best checkpoint"
    if trainer.get("fast_dev_run"):
        raise UserError(f"trainer.fast_dev_run={trainer.fast_dev_run} writes no checkpoints: {uses}")
    if trainer.get("enable_checkpointing") is False:
        raise UserError(f"trainer.enable_checkpointing=False writes no checkpoints: {uses}")
    for key in ("save_top_k", "every_n_epochs"):
        if checkpoint.get(key) == 0:
            raise UserError(f"checkpoint.{key}=0 keeps no best checkpoint: {uses}")
    if checkpoint.get("save_last") is False:
        raise UserError(
            f"checkpoint.save_last=False writes no last.ckpt: {what} finds each run's best checkpoint through "
            "it, and continues a killed run from it"
        )


# -- folders -------------------------------------------------------------------------------------------------
def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to single values (a list's items by index, `trainer.logger.0.init_args.name`), so a changed
    setting is named down to the value that differs."""
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def shown(value: Any, limit: int = 80) -> str:
    """A recorded setting's value for a one-line message: its repr, shortened in the middle when long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2 - 2]} ... {text[-(limit // 2 - 3) :]}"


def claim_folder(
    folder: Path,
    settings: dict[str, Any],
    what: str,
    name_flag: str,
    accept_change: Callable[[dict[str, Any], dict[str, Any], list[str]], None] | None = None,
) -> None:
    """Record `settings` in `folder` on first use; later, a UserError naming the first setting that differs.

    So a rerun continues only the study it was started as, never mixes other settings' runs into it. With
    `accept_change(recorded, now, changed_keys)` (flattened, dotted keys), a study decides itself whether a
    change leaves its finished work valid: it raises a UserError if not, and otherwise the command's settings
    replace the recorded ones.
    """
    path = folder / SETTINGS_FILE
    settings = json.loads(json.dumps(settings, default=str))
    if not path.exists():
        atomic_write_text(path, json.dumps(settings, indent=2) + "\n")
        return
    before, now = _flatten(json.loads(path.read_text())), _flatten(settings)
    changed = [key for key in sorted(before.keys() | now.keys()) if before.get(key) != now.get(key)]
    if not changed:
        return
    if accept_change is not None:
        accept_change(before, now, changed)
        atomic_write_text(path, json.dumps(settings, indent=2) + "\n")
        return
    key = changed[0]
    raise UserError(
        f"{what} {folder} was started with {setting_name(key)}={shown(before.get(key))}, this command has "
        f"{shown(now.get(key))}: rerun it with the same settings to continue it, choose another {name_flag}, "
        "or delete the folder to start over"
    )


def setting_name(key: str) -> str:
    """A flattened settings key as the command line spells it (without the `fit.` of the fit's config)."""
    return key.removeprefix("fit.")


@contextlib.contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder` for this process (an advisory lock the system drops when the process dies)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(
                f"{what} in {folder} is being run by another process (pid {f.read().strip() or '?'}); "
                "wait for it, or stop it first"
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


# -- the fit subprocess ----------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _stop_with_parent(parent: int) -> Callable[[], None]:
    """Run in the child before it starts: SIGTERM when the study process dies (Linux), so a killed study never
    leaves a fit running on its own; the fit saves its last.ckpt and exits, like under preemption."""

    def arrange() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before the call above
                os.kill(os.getpid(), signal.SIGTERM)

    return arrange


class Interrupted(SystemExit):
    """A study stopped by Ctrl-C or SIGTERM while a fit ran: the fit has saved its state and stopped; the
    one-line message has been printed. Not an `Exception`, so Optuna does not record the trial as failed."""


def fit_command(fit_args: Sequence[str], root_dir: Path, resume: bool) -> list[str]:
    """The command line of one fit of a study: this package's `fit` in this Python, `root_dir` its
    trainer.default_root_dir, continuing the run there with `resume`. The study reads each fit's best
    checkpoint itself: the fit tests none (`--test_after_fit false`)."""
    command = [sys.executable, "-m", PACKAGE, "fit", *map(str, fit_args)]
    command += ["--trainer.default_root_dir", str(root_dir), "--test_after_fit", "false"]
    return command + (["--ckpt_path", "last"] if resume else [])


def run_fit(
    fit_args: Sequence[str],
    root_dir: Path,
    what: str,
    env: dict[str, str],
    resume: bool,
    continue_hint: str = "rerun the same command to continue",
) -> None:
    """`python -m project fit <fit_args>` with `root_dir` as its trainer.default_root_dir, and `--ckpt_path
    last` with `resume` (continues the run in that folder). Waits for it; FitFailed unless it finished.
    Ctrl-C (which reaches the fit too) or a SIGTERM to this process (forwarded to the fit): once the fit has
    saved its last.ckpt and stopped, one `error:` line naming `what` and `continue_hint`, and `Interrupted`."""
    command = fit_command(fit_args, root_dir, resume)
    print(f"{what}: {shlex.join(['python', *command[1:]])}", flush=True)
    # Each fit its own W&B service: a child joining this process's (WANDB_SERVICE, set once wandb ran here)
    # would leave its run registered there if killed, and its resumed run, under the same id, be refused.
    # STUDY_RUN_ENV: a fit stopped early leaves the word to the study, which knows the command that continues.
    child_env = {k: v for k, v in (os.environ | env).items() if k != "WANDB_SERVICE"}
    child_env[STUDY_RUN_ENV] = what
    process = subprocess.Popen(command, env=child_env, preexec_fn=_stop_with_parent(os.getpid()))
    stopped: list[str] = []

    def forward(signum: int, frame: Any) -> None:
        stopped.append("SIGTERM")
        if process.poll() is None:
            process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        code = process.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the fit too (same process group): let it save and end first
        stopped.append("Ctrl-C")
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: the fit stops at once, so do we
            process.wait()
        code = process.poll()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped:
        signum = signal.SIGINT if stopped[0] == "Ctrl-C" else signal.SIGTERM
        print(f"error: stopped by {stopped[0]} during {what}; {continue_hint}", file=sys.stderr, flush=True)
        raise Interrupted(128 + signum)
    if code != 0:
        reason = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        raise FitFailed(f"{what} did not finish ({reason}; its output is above); its run is in {root_dir}")


def wandb_env(group: str, name: str, job_type: str) -> dict[str, str]:
    """W&B's own variables: every W&B logger of the fit (whatever the config) joins the group, named `name`."""
    return {"WANDB_RUN_GROUP": group, "WANDB_NAME": name, "WANDB_JOB_TYPE": job_type}
