"""Preemption warnings (SLURM's `--signal=USR1@N`): every process stops at the same step, saves, requeues.

A signal can arrive while a process is anywhere: in a forward pass, or waiting in the gradient all-reduce for
the other processes. A handler that saves a checkpoint right there (Lightning's SLURM auto-requeue does) runs
collectives (barriers, broadcasts) that the other processes are not running at that moment, and the job can
hang until its time limit. Here the handler only sets a flag. At the end of each training batch every process
takes part in one small all-reduce of the flags, so all of them learn about the signal at the same step even
when only one got it, and they stop there the way Lightning stops on SIGTERM: `last.ckpt` is saved
(BestAndLastCheckpoint), the run ends with `error: stopped by SIGUSR1 ...`, and under SLURM rank 0 requeues
the job, which continues the same run with `--ckpt_path last` when it starts again.

Inside a SLURM job, `fit` adds it with Lightning's own SLURM handler switched off
(`SLURMEnvironment(auto_requeue=False)`), unless the config chose a cluster environment itself.
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
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.errors import UserError, warn
from project.run import interrupts
from project.run import lightning_private as private


def slurm_job_id() -> str | None:
    """The id `scontrol requeue` takes for this job (`ARRAYID_TASKID` in an array), None outside SLURM."""
    array_id, task_id = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job_id = f"{array_id}_{task_id}" if array_id and task_id else os.environ.get("SLURM_JOB_ID")
    return job_id if job_id and re.fullmatch(r"[0-9_]+", job_id) else None


def request_stop(trainer: L.Trainer) -> None:
    """Make Lightning stop after this batch as if SIGTERM had arrived, without its SIGTERM handler (which
    broadcasts from inside the handler). Called on every process at the same step."""
    connector = trainer._signal_connector  # Lightning's private state behind `trainer.received_sigterm`
    if not hasattr(connector, "received_sigterm"):
        raise RuntimeError(
            "this Lightning version keeps no `received_sigterm`: StopAndRequeue needs updating"
        )
    connector.received_sigterm = True


class StopAndRequeue(Callback):
    """On `signal_name` (to any process), stop every process after the same training batch with `last.ckpt`
    saved; under SLURM (SLURM_JOB_ID set), rank 0 then runs `scontrol requeue` on the job.

    The handler is in place from the start of training to its end. A signal during validation takes effect
    after the next training batch. One that comes during an epoch's last batch waits for the epoch's
    validation and its checkpoint, and the run stops after the next batch (a checkpoint written between an
    epoch's last batch and its validation would skip that validation on resume); in the last epoch, the run
    just finishes. SLURM's warning must leave time for that: `--signal=USR1@N` with N above the time of one
    validation plus a checkpoint save.

    Args:
        signal_name: The signal that announces the end (SLURM's `--signal` sends SIGUSR1 unless told another).
        requeue: Under SLURM, requeue the job after the stop (rank 0 runs `scontrol requeue $SLURM_JOB_ID` as
            the process exits, after the run's files are closed: the requeue ends every process of the job).
        check_every_n_batches: How often the processes agree on the flag (one all-reduce of one number); a
            larger value costs less per step and reacts that many batches later.
    """

    def __init__(
        self, signal_name: str = "SIGUSR1", requeue: bool = True, check_every_n_batches: int = 1
    ) -> None:
        names = sorted(s.name for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP))
        if signal_name not in names:
            raise UserError(
                f"StopAndRequeue signal_name {signal_name!r} is not a signal: one of {', '.join(names)}"
            )
        if check_every_n_batches < 1:
            raise UserError(f"StopAndRequeue check_every_n_batches must be >= 1, got {check_every_n_batches}")
        self.signal_name = signal_name
        self.requeue = requeue
        self.check_every_n_batches = check_every_n_batches
        self.received = False  # set by the handler in this process
        self.stopped = False  # every process agreed to stop
        self._before: Any = None

    # -- the handler: a flag, nothing else (it may run in the middle of any computation or collective) --------

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # From here to the end of training; Lightning, which saves the process's handlers before this hook and
        # puts them back after the run, then restores the one this replaced.
        if threading.current_thread() is threading.main_thread():  # the only thread that may set handlers
            self.received = self.stopped = False
            self._before = signal.signal(signal.Signals[self.signal_name], self._on_signal)

    def _restore(self) -> None:
        if self._before is not None:
            signal.signal(signal.Signals[self.signal_name], self._before)
            self._before = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    # -- the agreement, at the same point on every process ------------------------------------------------------

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.stopped or (batch_idx + 1) % self.check_every_n_batches:
            return
        # Every process runs this all-reduce at every check, signalled or not: the flag stays set until the stop.
        if not trainer.strategy.reduce_boolean_decision(self.received, all=False):
            return
        if private.ends_epoch(trainer):
            return  # after this epoch's validation and checkpoint: the next batch stops
        self.stopped = True
        interrupts.stopped_by = self.signal_name
        rank_zero_info(
            f"{self.signal_name}: every process stops after step {trainer.global_step} and saves last.ckpt"
        )
        request_stop(trainer)  # BestAndLastCheckpoint, called after this callback, saves last.ckpt

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        if not (self.stopped and isinstance(exception, SIGTERMException)):
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
