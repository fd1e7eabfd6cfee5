"""What the cv and tune tests share beyond tests/folder_fits.py (tiny image folders, fit flags): a study's running
fit, a kill switch, a hold.

`KillOnce` is a callback for a fit subprocess: it SIGKILLs its own process once (a marker file remembers), at
the end of a chosen training epoch of the run whose folder contains `match`, e.g. fold 2 of a cv study.
`HoldUntilStopped` keeps a fit in training, once it has a last.ckpt, until the test's Ctrl-C or kill reaches it:
a tiny fit would otherwise often finish between the test seeing the checkpoint and stopping it.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import lightning as L
import psutil
from lightning.pytorch.callbacks import Callback

from project.callbacks.preemption import StopTogether
from tests.conftest import subprocess_env


def fit_with_checkpoint(study: subprocess.Popen, seconds: float = 240) -> tuple[psutil.Process, str]:
    """A running fit of the study (`cv` or `tune`, or a tune worker) once it has saved a last.ckpt: its process
    and its trial or fold folder."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert study.poll() is None, study.communicate()
        for child in psutil.Process(study.pid).children(recursive=True):
            try:
                command = child.cmdline()
            except psutil.Error:  # a short-lived helper gone (or a zombie) meanwhile
                continue
            if "fit" in command and "--trainer.default_root_dir" in command:
                # the last one: the study's own, after the user's
                folder = command[len(command) - command[::-1].index("--trainer.default_root_dir")]
                if list(Path(folder).rglob("last.ckpt")):
                    return child, folder
        time.sleep(0.1)
    raise AssertionError("no fit of the study reached its first checkpoint")


class KillOnce(Callback):
    """SIGKILLs this process at the end of training epoch `epoch` of the run under a folder containing `match`,
    once: `marker` is created first, so the resumed run goes on.

    Args:
        marker: A file that exists once the kill has happened.
        match: A part of trainer.default_root_dir (e.g. `fold_2`).
        epoch: The training epoch at whose end the process dies.
    """

    def __init__(self, marker: str, match: str, epoch: int = 1) -> None:
        self.marker, self.match, self.epoch = Path(marker), match, epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        here = self.match in str(trainer.default_root_dir) and trainer.current_epoch == self.epoch
        if here and not self.marker.exists():
            self.marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)


#: Set (to 1) in the environment of the one study process a test will stop; the study's fits inherit it.
HOLD_ENV = "PROJECT_TEST_HOLD_FIT"


class HoldUntilStopped(Callback):
    """In a fit whose environment sets `HOLD_ENV`: at the first training batch after a last.ckpt exists, waits
    until a stop signal has reached the fit (SIGTERM, or a Ctrl-C, which the fit turns into SIGTERM: the flag
    `StopTogether` keeps), at most `seconds`. `marker` is written when the wait starts, so a test can check it
    held."""

    def __init__(self, marker: str, seconds: float = 120) -> None:
        self.marker, self.seconds, self.held = Path(marker), seconds, False

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx
    ) -> None:
        if self.held or os.environ.get(HOLD_ENV) != "1":
            return
        if not any(Path(trainer.default_root_dir).rglob("last.ckpt")):
            return
        self.held = True
        self.marker.write_text("held")
        deadline = time.monotonic() + self.seconds
        (stop,) = [c for c in trainer.callbacks if isinstance(c, StopTogether)]
        while not stop.received and time.monotonic() < deadline:
            time.sleep(0.05)


def holding_env() -> dict[str, str]:
    """The environment of the one study process a test will stop: its fits hold (`HoldUntilStopped`)."""
    return {**subprocess_env(), HOLD_ENV: "1"}


def held(args: list[str], marker: Path) -> list[str]:
    """The study's arguments plus `HoldUntilStopped` (which holds only where `HOLD_ENV` is set)."""
    hold = {"class_path": f"{__name__}.HoldUntilStopped", "init_args": {"marker": str(marker)}}
    return [*args, f"--trainer.callbacks+={json.dumps(hold)}"]
