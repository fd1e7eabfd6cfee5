"""Ctrl-C during `fit`: stop after the current batch with the state saved, as for SIGTERM.

Lightning stops a run gracefully on SIGTERM (the preemption signal): it finishes the batch, every process
agrees to stop at the same step, and the checkpoint callback saves `last.ckpt` (BestAndLastCheckpoint). On
Ctrl-C (SIGINT) it would raise KeyboardInterrupt wherever the process happens to be and save nothing. With
`CtrlCStopsAfterTheBatch`, the first Ctrl-C is turned into that SIGTERM path; a second one stops at once.
"""

import logging
import os
import signal
import sys
import threading
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

#: What stopped the run early, for the one-line message at exit.
stopped_by = "SIGTERM"
#: Set by `cv` and `tune` in each fit they start (to the fold or trial it is): the study says what continues it.
STUDY_RUN_ENV = "PROJECT_STUDY_RUN"
#: Lightning's own line for the SIGTERM the first Ctrl-C is turned into: not what the user sent.
_SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"


def resume_hint() -> str | None:
    """What continues a run stopped early, for its one-line message; None inside a study (cv, tune), whose
    own line names the command that continues it (`--ckpt_path` is the study's to set)."""
    if os.environ.get(STUDY_RUN_ENV):
        return None
    return "resume with the same command plus --ckpt_path last"


def _not_the_ctrl_c_sigterm(record: logging.LogRecord) -> bool:
    return not (stopped_by.startswith("Ctrl-C") and "Received SIGTERM" in record.getMessage())


class CtrlCStopsAfterTheBatch(Callback):
    """From the start of training to its end, the first Ctrl-C stops the run like SIGTERM does."""

    def __init__(self) -> None:
        self._before: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = logging.getLogger(_SIGNAL_LOGGER)
        if _not_the_ctrl_c_sigterm not in logger.filters:
            logger.addFilter(_not_the_ctrl_c_sigterm)
        if threading.current_thread() is threading.main_thread():  # the only thread that may set handlers
            self._before = signal.signal(signal.SIGINT, self._on_first_ctrl_c)

    def _on_first_ctrl_c(self, signum: int, frame: Any) -> None:
        global stopped_by
        stopped_by = "Ctrl-C (SIGINT)"
        self._restore()  # a second Ctrl-C stops at once
        print(
            "\nCtrl-C: stopping after this batch and saving last.ckpt (Ctrl-C again to stop at once)",
            file=sys.stderr,
        )
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's graceful stop, agreed on by every process

    def _restore(self) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)
            self._before = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
