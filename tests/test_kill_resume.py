"""Surviving kills: atomic checkpoint writes, periodic and SIGTERM checkpoints, `--ckpt_path last` resume.

The end-to-end test kills a real `python -m project fit` with SIGKILL at several moments (during a checkpoint
write, and just after random steps), once with SIGTERM (preemption), resumes each time with
`--ckpt_path last` and checks the finished run against an uninterrupted one with the same seed.
"""

import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from project.atomic_files import partial_path
from project.callbacks.rng_state import collect_rng_states, set_rng_states
from project.cli import main
from project.run.checkpoints import AtomicCheckpointIO
from project.run.resume import find_last_checkpoint, keep_csv_metrics
from tests.conftest import CONFIGS, ROOT, run_cli, subprocess_env


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("simulated crash in the middle of writing a checkpoint")


def test_atomic_write_keeps_the_previous_checkpoint_when_a_write_fails(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    big = {"state_dict": {"w": torch.zeros(1_000_000)}, "global_step": 2, "payload": Unpicklable()}
    with pytest.raises(RuntimeError, match="simulated crash"):
        io.save_checkpoint(big, path)
    # The previous checkpoint is intact, and no temporary file is left behind.
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert list(path.parent.iterdir()) == [path]
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 3}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 3


def test_a_leftover_partial_file_is_ignored_and_replaced(tmp_path):
    path = tmp_path / "last.ckpt"
    partial_path(path).write_bytes(b"half a checkpoint from a killed process")
    assert find_last_checkpoint(tmp_path) is None  # a partial file is never mistaken for a checkpoint
    AtomicCheckpointIO().save_checkpoint({"global_step": 5}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 5 and not partial_path(path).exists()


def test_find_last_checkpoint_picks_the_newest(tmp_path):
    old, new = (
        tmp_path / "runs/version_0/checkpoints/last.ckpt",
        tmp_path / "runs/version_1/checkpoints/last-v1.ckpt",
    )
    for i, p in enumerate([old, new, tmp_path / "runs/version_1/checkpoints/epoch001.ckpt"]):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
        os.utime(p, ns=(10**18 + i, 10**18 + i))
    assert find_last_checkpoint(tmp_path) == new
    assert find_last_checkpoint(tmp_path, dirpath=old.parent) == old
    assert find_last_checkpoint(tmp_path / "nothing") is None


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    import random as pyrandom

    import numpy as np

    torch.manual_seed(0)
    states = collect_rng_states()
    torch.save({"rng": states}, tmp_path / "c.ckpt")
    expected = (torch.rand(3), np.random.rand(3), pyrandom.random())
    set_rng_states(torch.load(tmp_path / "c.ckpt", weights_only=True)["rng"])
    again = (torch.rand(3), np.random.rand(3), pyrandom.random())
    assert torch.equal(expected[0], again[0]) and (expected[1] == again[1]).all() and expected[2] == again[2]


def test_resumed_csv_metrics_keep_the_rows_before_the_checkpoint(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    run = tmp_path / "runs" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,val/acc\n0,7,0.5\n1,15,0.6\n2,23,0.7\n")
    logger = CSVLogger(tmp_path, name="runs", version="version_0")
    keep_csv_metrics(logger, before_step=16)  # the checkpoint was written at step 16: the step-23 row goes
    logger.log_metrics({"val/acc": 0.65, "epoch": 2}, step=23)
    logger.save()
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["val/acc"]) for r in rows] == [("7", "0.5"), ("15", "0.6"), ("23", "0.65")]
    assert not (run / ".metrics.csv.resume").exists()


def test_best_validation_accuracy_survives_a_resume():
    from project.models import MLP
    from project.tasks import ImageClassifier

    trained = ImageClassifier(MLP(num_classes=10, hidden=8), num_classes=10)
    trained.val_best.update(torch.tensor(0.75))
    trained.val_best.update(torch.tensor(0.5))
    checkpoint = {}
    trained.on_save_checkpoint(checkpoint)
    resumed = ImageClassifier(MLP(num_classes=10, hidden=8), num_classes=10)
    resumed.on_load_checkpoint(checkpoint)
    resumed.val_best.update(torch.tensor(0.6))  # a worse epoch after the resume
    assert resumed.val_best.compute().item() == 0.75


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a metrics.csv, each with its non-empty values only (the header grows as keys appear)."""
    rows = csv.DictReader(path.read_text().splitlines()) if path.exists() else []
    return [{k: v for k, v in row.items() if v} for row in rows]


def val_epochs(run: Path) -> list[int]:
    return sorted({int(r["epoch"]) for r in csv_rows(run / "metrics.csv") if r.get("val/loss")})


class WhatAKillLeaves(Callback):
    """After every training batch and at the start of every validation, records what a process killed at that
    moment would leave: the step of last.ckpt and the rows of metrics.csv on disk; keeps a copy of last.ckpt
    at the start of the first validation."""

    moments: list[tuple[int, list[dict[str, str]]]] = []

    def _record(self, trainer: L.Trainer) -> Path | None:
        last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        if last.exists():
            step = torch.load(last, weights_only=True)["global_step"]
            type(self).moments.append((step, csv_rows(Path(trainer.logger.log_dir) / "metrics.csv")))
            return last
        return None

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self._record(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        last = self._record(trainer)
        if not trainer.sanity_checking and trainer.current_epoch == 0 and last:
            (last.parent.parent / "killed-in-validation.ckpt").write_bytes(last.read_bytes())


def test_what_a_kill_leaves_resumes_into_the_whole_history(fake_cifar, tmp_path):
    # 4 batches an epoch and last.ckpt every 2 steps: step 4 is both an epoch's last batch and a save point.
    WhatAKillLeaves.moments = []
    args = [*fit_args(fake_cifar, tmp_path, "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4"),
            "--trainer.limit_val_batches", "2", "--checkpoint.last_every_n_train_steps", "2"]  # fmt: skip
    main([*map(str, args), "--trainer.callbacks+=tests.test_kill_resume.WhatAKillLeaves"])
    run = tmp_path / "runs" / "version_0"
    # Every row logged before the step a checkpoint holds was on disk with it (the learning-rate rows, which
    # LearningRateMonitor logs at each epoch start, included): the resumed run does not log them again.
    final = csv_rows(run / "metrics.csv")
    assert {r["step"] for r in final if r.get("lr-AdamW/pg1")} == {"0", "4"}
    for step, on_disk in WhatAKillLeaves.moments:
        assert [r for r in final if int(r["step"]) < step] == [r for r in on_disk if int(r["step"]) < step]

    # Killed during the first validation: last.ckpt holds a state before it, and the run resumed from there
    # validates that epoch (from a state saved after the epoch's last batch Lightning would go on to the next).
    killed = run / "killed-in-validation.ckpt"
    assert torch.load(killed, weights_only=True)["global_step"] < 4
    main([*map(str, args), "--ckpt_path", str(killed)])  # an explicit path: a new run folder from that state
    assert val_epochs(run) == val_epochs(tmp_path / "runs" / "version_1") == [0, 1]


class LastStepAtEpochStart(Callback):
    """Records the step last.ckpt holds at the start of every epoch."""

    steps: list[int] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        type(self).steps.append(torch.load(last, weights_only=True)["global_step"] if last.exists() else 0)


def test_an_epoch_without_validation_still_saves_its_last_step(fake_cifar, tmp_path):
    # Validation every second epoch, 4 batches an epoch, last.ckpt every 2 steps: no save follows the last batch
    # of epochs 0 and 2 (the periodic one there is left out), so the epoch's end saves the step.
    LastStepAtEpochStart.steps = []
    args = [*fit_args(fake_cifar, tmp_path, "--trainer.max_epochs", "4", "--trainer.limit_train_batches", "4"),
            "--trainer.limit_val_batches", "2", "--trainer.check_val_every_n_epoch", "2",
            "--checkpoint.last_every_n_train_steps", "2"]  # fmt: skip
    main([*map(str, args), "--trainer.callbacks+=tests.test_kill_resume.LastStepAtEpochStart"])
    assert LastStepAtEpochStart.steps == [0, 4, 8, 12]


# -- end to end --------------------------------------------------------------------------------------------
def fit_args(data: Path, root: Path, *extra: str) -> list[str]:
    return [
        "fit", "--config", CONFIGS / "cifar10.yaml",
        "--model.net", "project.models.SimpleCNN",
        "--model.optimizer", "AdamW", "--model.optimizer.init_args.lr", "0.002", "--model.scheduler", "null",
        "--data.data_dir", data, "--data.download", "false", "--data.val_size", "100", "--data.batch_size", "25",
        "--trainer.precision", "32-true", "--trainer.max_epochs", "3", "--trainer.deterministic", "true",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--checkpoint.last_every_n_train_steps", "3", "--trainer.default_root_dir", root, *extra,
    ]  # fmt: skip


STEPS = 3 * 16  # what fit_args trains: 3 epochs of 400 images in batches of 25


def start(args: list, cwd: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "tests" / "patched_main.py"), *map(str, args)]
    return subprocess.Popen(
        cmd, cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for(condition, proc: subprocess.Popen, timeout: float = 300, poll: float = 0.0005) -> bool:
    """Poll `condition` until it holds (True) or the process ends first (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    raise TimeoutError("the training process made no progress")


def mtime(path: Path) -> int:
    return path.stat().st_mtime_ns if path.exists() else 0


def saved_step(path: Path) -> int:
    """The global step of the checkpoint at `path` (mmap: its tensors are not read)."""
    return torch.load(path, weights_only=True, mmap=True)["global_step"]


def newest_partial(path: Path) -> int:
    """The mtime of the newest hidden partial file of `path` (any process's), 0 if there is none."""
    return max((mtime(p) for p in path.parent.glob(f".{path.name}.*.partial")), default=0)


def final_val(run: Path) -> dict:
    rows = [r for r in csv_rows(run / "metrics.csv") if r.get("val/loss")]
    return {int(r["epoch"]): (float(r["val/loss"]), float(r["val/acc"])) for r in rows}


@pytest.mark.slow
def test_killed_at_random_moments_resumes_and_matches_an_uninterrupted_run(fake_cifar, tmp_path, capsys):
    reference = start(fit_args(fake_cifar, tmp_path / "ref"), tmp_path)  # runs while the other one is killed
    root = tmp_path / "killed"
    run = root / "runs" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    rng = random.Random(20260)
    steps, moments = [], ["random", "during-write", "sigterm"]
    for moment in moments:
        proc = start(fit_args(fake_cifar, root, "--ckpt_path", "last"), tmp_path)
        before = mtime(last)
        if moment == "during-write":
            # The hidden partial file exists only while a checkpoint is being written. The SIGKILL at a random
            # moment may have left one behind: wait for a write of this process's own (a newer partial file).
            stale = newest_partial(last)
            hit = wait_for(lambda b=before, s=stale: newest_partial(last) > s and mtime(last) == b, proc)
        else:  # after the process has saved progress of its own up to a random step, at a random moment
            # A step, not a delay: however fast the machine, the kill lands before the run ends. The first kill
            # leaves room for two more segments; the last one comes at least 9 steps before the end.
            low = max(steps, default=0) + 1
            target = rng.randint(low, max(low, 24 if not steps else STEPS - 9))
            hit = wait_for(
                lambda b=before, t=target: mtime(last) > b and saved_step(last) >= t, proc, poll=0.02
            )
            time.sleep(rng.uniform(0.0, 0.1))
        proc.send_signal(signal.SIGTERM if moment == "sigterm" else signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert hit and proc.returncode != 0, f"{moment}: the run ended before the kill\n{err[-3000:]}"
        if moment == "during-write":
            assert newest_partial(last)  # killed mid-write: the half-written file is the hidden one
        if moment == "sigterm":
            assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err[-3000:]
            assert "Traceback" not in err
        checkpoint = torch.load(last, weights_only=True)  # the previous last.ckpt is intact whatever happened
        steps.append(checkpoint["global_step"])
    assert steps == sorted(steps) and steps[-1] > steps[0], steps  # every resume made progress

    out = run_cli(*fit_args(fake_cifar, root, "--ckpt_path", "last"), cwd=tmp_path)
    assert "Restored all states" in out.stdout + out.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 3 * 16  # 3 epochs of 400 images / 25
    _, err = reference.communicate(timeout=600)
    assert reference.returncode == 0, err[-3000:]

    # One run folder, one W&B run (resumed under the same id), the whole history in one metrics.csv.
    assert [p.name for p in (root / "runs").iterdir() if not p.name.startswith(".")] == ["version_0"]
    # A segment killed before its W&B run started (after its first step, in the background) has no folder.
    wandb_ids = {p.name.rsplit("-", 1)[1] for p in (root / "wandb").glob("offline-run-*")}
    assert len(wandb_ids) == 1 and 1 <= len(list((root / "wandb").glob("offline-run-*"))) <= len(moments) + 1
    assert torch.load(last, weights_only=True)["run_info"]["wandb_run_id"] in wandb_ids

    # `--ckpt_path best` finds the best checkpoint recorded in the newest last.ckpt.
    main(
        [
            "validate",
            *map(str, fit_args(fake_cifar, root)[1:]),
            "--ckpt_path",
            "best",
            "--trainer.logger",
            "false",
        ]
    )
    chosen = capsys.readouterr().out.split("--ckpt_path best: ", 1)[1].split(" (step")[0]
    assert Path(chosen).parent == last.parent and Path(chosen).name.startswith("epoch")

    killed, uninterrupted = final_val(run), final_val(tmp_path / "ref" / "runs" / "version_0")
    assert sorted(killed) == sorted(uninterrupted) == [0, 1, 2]
    # Every resume continued exactly (the loader's position and every generator are in last.ckpt): the same bits.
    reference = torch.load(tmp_path / "ref/runs/version_0/checkpoints/last.ckpt", weights_only=True)
    weights, expected = torch.load(last, weights_only=True)["state_dict"], reference["state_dict"]
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], v) for k, v in expected.items())
    (loss, acc), (ref_loss, ref_acc) = killed[2], uninterrupted[2]
    print("final val (loss, acc): interrupted", killed, "uninterrupted", uninterrupted)
    assert abs(loss - ref_loss) < 0.1 and abs(acc - ref_acc) <= 0.05, (killed, uninterrupted)
