"""Fault injection on real `python -m project fit` processes: Ctrl-C mid-epoch, a disk that fills up, two runs
started at once into one folder. After each, `--ckpt_path last` continues the right run from its newest intact
checkpoint and finishes, and nothing in a run folder is partial or belongs to another run. (SIGKILL at random
moments, also during a checkpoint write, and SIGTERM: tests/test_kill_resume.py.)
"""

import csv
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import newest_run, run_cli
from tests.test_kill_resume import STEPS, fit_args, mtime, start, wait_for

pytestmark = pytest.mark.slow


def steps_logged(run: Path) -> list[int]:
    """The steps of the training and validation rows (not the test of the best checkpoint a fit ends with)."""
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return [int(r["step"]) for r in rows if not any(v for k, v in r.items() if k.startswith("test/"))]


def assert_whole(run: Path) -> None:
    """The run folder holds one run: no partial files, metrics in order, the checkpoint of the last step."""
    assert not [p for p in run.rglob("*") if p.name.startswith(".") and p.name != ".metrics.csv.resume"], run
    steps = steps_logged(run)
    assert (
        steps == sorted(steps)
        and torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS
    )


def test_ctrl_c_mid_epoch_saves_the_step_and_says_how_to_resume(fake_cifar, tmp_path):
    root = tmp_path / "logs"
    args = fit_args(fake_cifar, root, "--checkpoint.last_every_n_train_steps", "1000")
    proc = start(args, tmp_path)
    # Mid-epoch: after a few training steps of the second epoch, at a random moment.
    assert wait_for(lambda: any(root.glob("runs/version_0/checkpoints/epoch*.ckpt")), proc, poll=0.05)
    time.sleep(random.Random(7).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "error: stopped by Ctrl-C (SIGINT); resume with the same command plus --ckpt_path last" in err
    assert "Traceback" not in err
    saved = torch.load(root / "runs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)[
        "global_step"
    ]
    # The step it stopped at (the end of the first epoch when the Ctrl-C came before the second one's first step).
    assert 16 <= saved < STEPS and f"Ctrl-C (SIGINT): the state at step {saved} is in" in err, err[-3000:]

    run_cli(*args, "--ckpt_path", "last", cwd=tmp_path)  # the same command
    assert [p.name for p in (root / "runs").glob("version_*")] == ["version_0"]
    assert_whole(root / "runs" / "version_0")


def test_a_full_disk_stops_with_one_line_and_the_run_continues_from_its_intact_checkpoint(
    fake_cifar, tmp_path
):
    disk = tmp_path / "disk"
    disk.mkdir()
    # A tmpfs that holds one checkpoint of this network, not two: the first validation writes the best
    # checkpoint, then last.ckpt finds the disk full.
    size = 150_000
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True
    ).returncode:
        pytest.fail(
            "cannot mount a tmpfs here; tests/test_hardening.py covers a full disk with a patched write"
        )
    try:
        tiny = [
            "--model.net.init_args.width",
            "4",
            "--model.net.init_args.hidden",
            "8",
            "--checkpoint.dirpath",
            disk,
        ]
        args = fit_args(fake_cifar, tmp_path / "logs", *tiny, "--checkpoint.last_every_n_train_steps", "1000")
        failed = run_cli(*args, cwd=tmp_path, check=False)
        assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
        (line,) = [x for x in failed.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith("error: no space left on the device to write the checkpoint ")
        intact = [p for p in disk.glob("*.ckpt")]
        assert len(intact) == 1 and not list(disk.glob(".*"))  # the best checkpoint, nothing half-written
        assert torch.load(intact[0], weights_only=True)["global_step"] == 16

        subprocess.run(["mount", "-o", "remount,size=50m", str(disk)], check=True)  # space again
        run_cli(*args, "--ckpt_path", "last", cwd=tmp_path)
        assert torch.load(disk / "last.ckpt", weights_only=True)["global_step"] == STEPS
        assert [p.name for p in (tmp_path / "logs" / "runs").glob("version_*")] == ["version_0"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_two_runs_started_at_once_into_one_folder_stay_apart(fake_cifar, tmp_path):
    root = tmp_path / "logs"
    procs = [
        start(fit_args(fake_cifar, root, "--trainer.max_epochs", "2", "--seed_everything", seed), tmp_path)
        for seed in (1, 2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    runs = sorted((root / "runs").glob("version_*"))
    assert [p.name for p in runs] == ["version_0", "version_1"]
    seeds = {
        torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["run_info"]["config"][
            "seed_everything"
        ]
        for run in runs
    }
    assert seeds == {1, 2}  # each folder holds one run's checkpoints ...
    for run in runs:  # ... and its own config and metrics
        assert steps_logged(run) == sorted(steps_logged(run)) and max(steps_logged(run)) == 2 * 16 - 1
        assert "seed_everything" in (run / "config.yaml").read_text()

    # The newest one continues; a second `--ckpt_path last` while it runs is turned away, and writes nothing.
    newest = newest_run(root)
    seed = torch.load(newest / "checkpoints" / "last.ckpt", weights_only=True)["run_info"]["config"][
        "seed_everything"
    ]
    args = fit_args(fake_cifar, root, "--seed_everything", seed, "--ckpt_path", "last")
    first = start(args, tmp_path)
    before = mtime(newest / "checkpoints" / "last.ckpt")
    assert wait_for(
        lambda: (newest.parent / f".{newest.name}.lock").read_text().startswith(f"process {first.pid}"),
        first,
        poll=0.05,
    )
    # Paused, the first run stays running however fast its epoch is while the second one starts up.
    first.send_signal(signal.SIGSTOP)
    try:
        second = run_cli(*args, cwd=tmp_path, check=False)
    finally:
        first.send_signal(signal.SIGCONT)
    assert (
        second.returncode == 1
        and f"the run in {newest} is still running (process {first.pid}" in second.stderr
    )
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert mtime(newest / "checkpoints" / "last.ckpt") > before
    assert_whole(newest)
