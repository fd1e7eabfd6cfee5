"""Stopping every process at the same step: on SIGTERM, Ctrl-C, or SLURM's preemption warning.

A signal can arrive while a process is anywhere: in a forward pass, or waiting in the gradient all-reduce for
the other processes, and it may reach one process only (`kill PID`, a node's OOM killer warning, SLURM's
`scancel --signal` to one task). Lightning's own SIGTERM handler broadcasts from inside the handler, and its
SLURM auto-requeue handler saves a checkpoint there: collectives the other processes are not running at that
moment, so the job hangs until its time limit, or one process stops while the others wait for it for ever.
Here a handler only sets a flag. At the end of each training batch every process takes part in one small
all-reduce of the flags, so all of them learn about the signal at the same step even when only one got it,
and they stop there through Lightning's own stop path: `last.ckpt` is saved (BestAndLastCheckpoint) on every
process at once, and the run ends with `error: stopped by ...; resume with ... --ckpt_path last`.

`fit` always has `StopTogether` (SIGTERM; the first Ctrl-C arrives as SIGTERM, see `interrupts`). Inside a
SLURM job it has `StopAndRequeue` instead, which also takes SIGUSR1 (`--signal=USR1@N`) and then requeues the
job, with Lightning's own SLURM handler switched off (`SLURMEnvironment(auto_requeue=False)`) unless the config
chose a cluster environment itself.
"""

import atexit
import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project import lightning_private as private
from project.callbacks import interrupts
from project.errors import UserError, warn


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes for this job (`ARRAYID_TASKID` in an array), None outside SLURM."""
    array_id, task_id = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_id}_{task_id}" if array_id and task_id else os.environ.get("SLURM_JOB_ID")
    return job_id if job_id and re.fullmatch(r"[0-9_]+", job_id) else None


def signal_named(name: str, key: str) -> signal.Signals:
    names = sorted(s.name for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP))
    if name not in names:
        raise UserError(f"{key} {name!r} is not a signal: one of {', '.join(names)}")
    return signal.Signals[name]


class StopTogether(Callback):
    """On SIGTERM to any process (or the first Ctrl-C, which arrives as SIGTERM), every process stops after the
    same training batch with `last.ckpt` saved.

    The handler is in place from the start of training to its end. A signal during validation takes effect
    after the next training batch. One that comes during an epoch's last batch waits for the epoch's
    validation and its checkpoint, and the run stops after the next batch (a checkpoint written between an
    epoch's last batch and its validation would skip that validation on resume), or, where the next check
    comes at an epoch's last batch too (epochs of one batch, or of `check_every_n_batches` batches), after
    that epoch's validation and checkpoint. In the last epoch, the run just finishes.

    Args:
        check_every_n_batches: How often the processes agree on the flags (one all-reduce of one number); a
            larger value costs less per step and reacts that many batches later.
    """

    #: The signals this callback stops on, in order of precedence: when processes got different ones, the
    #: run stops for the last one any of them got.
    signal_names: tuple[str, ...] = ("SIGTERM",)

    def __init__(self, check_every_n_batches: int = 1) -> None:
        if check_every_n_batches < 1:
            raise UserError(
                f"{type(self).__name__} check_every_n_batches must be >= 1, got {check_every_n_batches}"
            )
        self.check_every_n_batches = check_every_n_batches
        self._before: dict[signal.Signals, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self.received = 0  # set by the handler in this process: 1 + the index of the signal in signal_names
        self.stopped_by: str | None = None  # the signal every process agreed to stop for
        self._batches = 0  # training batches run in this fit (the same number on every process)
        self._agreed = 0  # the flags every process agreed on, at an epoch's last batch: the stop waits
        self._at_epoch_end = False  # the wait reached an epoch's last batch again: stop at that epoch's end

    # -- the handler: a flag, nothing else (it may run in the middle of any computation or collective) --------

    def _on_signal(self, signum: int, frame: Any) -> None:
        code = 1 + self.signal_names.index(signal.Signals(signum).name)
        self.received = max(self.received, code)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        # From the moment Lightning installs its SIGTERM handler (after the model is set up, before the sanity
        # check) to the start of training, its handler sets this flag too, and every process acts on it after
        # the first training batch.
        private.route_sigterm(trainer, self._on_signal)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A run resumed from the stop continues at the batch after it, whenever its loader was created.
        private.load_pending_train_loader_state(trainer)
        # From here to the end of training, in place of Lightning's handlers (Lightning, which saves the
        # process's handlers before this hook and restores them after the run, gets its own back then).
        if threading.current_thread() is threading.main_thread():  # the only thread that may set handlers
            for name in self.signal_names:
                self._before[signal.Signals[name]] = signal.signal(signal.Signals[name], self._on_signal)

    def _restore(self) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        self._before = {}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    # -- the agreement, at the same point on every process ------------------------------------------------------

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Counted here, not by batch_idx: an epoch shorter than check_every_n_batches would never be checked.
        self._batches += 1
        if self.stopped_by or self._batches % self.check_every_n_batches:
            return
        # Every process runs this all-reduce at every check, signalled or not: the flag stays set until the stop.
        flag = torch.tensor(self.received, device=trainer.strategy.root_device)
        code = int(trainer.strategy.reduce(flag, reduce_op="max"))
        if not code:
            return
        if private.ends_epoch(trainer):
            # After this epoch's validation and checkpoint: the next check stops, unless it too comes at an
            # epoch's last batch (epochs of one batch): then the stop comes at that epoch's end. Every process
            # takes the same branch (the same flags, the same batch).
            self._at_epoch_end = bool(self._agreed)
            self._agreed = code
            return
        self._stop(trainer, code, f"after step {trainer.global_step}")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the epoch's validation and the checkpoints it saved; Lightning raises SIGTERMException once the
        # epoch's end is done (its loop state then saved says the epoch is complete; last.ckpt, written after the
        # validation, resumes at the epoch's end). Where training ends with this epoch anyway, it just finishes.
        if self._at_epoch_end and not self.stopped_by and not _training_ends_with_this_epoch(trainer):
            self._stop(
                trainer,
                self._agreed,
                f"at the end of epoch {trainer.current_epoch} (step {trainer.global_step})",
            )

    def _stop(self, trainer: L.Trainer, code: int, where: str) -> None:
        self.stopped_by = self.signal_names[code - 1]
        if self.stopped_by != "SIGTERM":  # SIGTERM keeps what interrupts recorded (Ctrl-C arrives as one)
            interrupts.stopped_by = self.stopped_by
        rank_zero_info(f"{interrupts.stopped_by}: every process stops {where} and saves last.ckpt")
        # Lightning stops after this batch (or this epoch's end), on every process alike, and
        # BestAndLastCheckpoint (called after this callback) saves last.ckpt first, unless this step's is saved.
        private.stop_after_this_batch(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()


def _training_ends_with_this_epoch(trainer: L.Trainer) -> bool:
    """At an epoch's end: whether training stops after it (max_epochs, max_steps, or a stop asked for)."""
    max_epochs = trainer.max_epochs
    if max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1:
        return True
    return 0 <= trainer.max_steps <= trainer.global_step or trainer.should_stop


class StopAndRequeue(StopTogether):
    """`StopTogether`, also on SLURM's preemption warning (`--signal=USR1@N`), after which rank 0 requeues the
    job (SLURM_JOB_ID set): it continues the same run with `--ckpt_path last` when it starts again. SIGTERM
    (`scancel`, the time limit) still stops without a requeue.

    SLURM's warning must leave time for the stop: `--signal=USR1@N` with N above the time of one validation
    plus a checkpoint save.

    Args:
        signal_name: The preemption warning (SLURM's `--signal` sends SIGUSR1 unless told another).
        requeue: Under SLURM, requeue the job after the stop (rank 0 runs `scontrol requeue $SLURM_JOB_ID` as
            the process exits, after the run's files are closed: the requeue ends every process of the job).
        check_every_n_batches: How often the processes agree on the flags (see `StopTogether`).
    """

    def __init__(
        self, signal_name: str = "SIGUSR1", requeue: bool = True, check_every_n_batches: int = 1
    ) -> None:
        signal_named(signal_name, "StopAndRequeue signal_name")
        if signal_name == "SIGTERM":
            raise UserError(
                "StopAndRequeue signal_name SIGTERM: SIGTERM always stops; name the warning signal"
            )
        super().__init__(check_every_n_batches)
        self.signal_name = signal_name
        self.signal_names = ("SIGTERM", signal_name)  # the warning outranks SIGTERM: the job is requeued
        self.requeue = requeue

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        super().on_exception(trainer, pl_module, exception)
        if self.stopped_by != self.signal_name or not isinstance(exception, SIGTERMException):
            return
        job_id = slurm_job_id()
        if self.requeue and job_id and trainer.is_global_zero:
            atexit.register(requeue_slurm_job, job_id)


def requeue_slurm_job(job_id: str) -> None:
    """`scontrol requeue JOB`: SLURM ends the job's processes (SIGTERM) and starts the job again later."""
    # This process is exiting with its files closed: the requeue's SIGTERM must not cut that exit short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"Requeuing SLURM job {job_id}: it continues from last.ckpt when it starts again", file=sys.stderr)
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        warn(f"could not requeue SLURM job {job_id} ({e}): resubmit it; it resumes with --ckpt_path last")
        return
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip().splitlines()
        warn(
            f"scontrol requeue {job_id} failed ({reason[-1] if reason else f'exit {result.returncode}'}): "
            "resubmit the job; it resumes with --ckpt_path last"
        )
