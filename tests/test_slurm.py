"""Preemption under SLURM: SIGUSR1 stops every process at the same step, saves, and requeues the job.

In-process tests check the callback on one process; the DDP tests start 2 gloo processes as `srun -n 2`
would (tests/slurm/ranks.py) and signal one of them in the middle of training; the SLURM test submits the
shipped configs/slurm/train.sbatch to the one-node cluster of tests/slurm/start_cluster.sh (CI starts it;
the test skips without it) and preempts it with `scancel --signal=USR1`.
"""

import csv
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.callbacks import interrupts, preemption
from project.callbacks.checkpoint import BestAndLastCheckpoint
from project.callbacks.preemption import StopAndRequeue, requeue_slurm_job, slurm_job_id
from project.errors import UserError
from tests.conftest import CONFIGS, ROOT, subprocess_env
from tests.fakes import make_image_folder
from tests.slurm.ranks import JOB_ID, fake_scontrol, signal_after_step, start_step

# -- one process, in this one --------------------------------------------------------------------------------


def test_bad_settings_are_one_line_errors():
    with pytest.raises(UserError, match="signal_name 'USR1' is not a signal: one of .*SIGUSR1"):
        StopAndRequeue(signal_name="USR1")
    with pytest.raises(UserError, match="check_every_n_batches must be >= 1, got 0"):
        StopAndRequeue(check_every_n_batches=0)


def test_the_job_id_to_requeue(monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    assert slurm_job_id() is None  # not under SLURM: nothing to requeue
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    assert slurm_job_id() == "123"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "120")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert slurm_job_id() == "120_3"  # an array task is requeued by its own id


class SignalAt(Callback):
    """Sends `signum` to this process at the end of the training batch that reaches `step`."""

    def __init__(self, step: int, signum: int = signal.SIGUSR1) -> None:
        self.step, self.signum, self.validations = step, signum, 0

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.validations += 1


def fit_until_signal(tmp_path: Path, at_step: int, monkeypatch) -> tuple[L.Trainer, SignalAt, list]:
    """A tiny fit (5 batches per epoch) signalled at `at_step`; returns the trainer and what would be requeued."""
    monkeypatch.setattr(interrupts, "stopped_by", interrupts.stopped_by)  # the run sets it: put it back after
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    requeued: list = []
    monkeypatch.setattr(preemption.atexit, "register", lambda fn, *args: requeued.append((fn, *args)))
    probe = SignalAt(at_step)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=3, limit_train_batches=5, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[probe, StopAndRequeue(), BestAndLastCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)],
    )  # fmt: skip
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    return trainer, probe, requeued


def saved_step(tmp_path: Path) -> int:
    return torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=True)["global_step"]


def test_a_signal_stops_after_the_batch_with_last_ckpt_saved_and_the_job_requeued(tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGUSR1)
    trainer, _, requeued = fit_until_signal(tmp_path, at_step=3, monkeypatch=monkeypatch)
    assert trainer.global_step == 3 and saved_step(tmp_path) == 3
    assert interrupts.stopped_by == "SIGUSR1"  # the CLI's message: "error: stopped by SIGUSR1; resume ..."
    assert requeued == [(requeue_slurm_job, "77")]  # as the process exits, not in the middle of the run
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_signal_in_an_epochs_last_batch_stops_after_its_validation(tmp_path, monkeypatch):
    # A checkpoint between an epoch's last batch and its validation would skip that validation on resume.
    trainer, probe, _ = fit_until_signal(tmp_path, at_step=5, monkeypatch=monkeypatch)
    assert probe.validations == 1 and trainer.global_step == 6 and saved_step(tmp_path) == 6


def test_requeue_runs_scontrol_and_says_so(tmp_path, monkeypatch, capsys):
    record = tmp_path / "scontrol.txt"
    monkeypatch.setenv("PATH", f"{fake_scontrol(tmp_path / 'bin', record)}:{os.environ['PATH']}")
    before = signal.getsignal(signal.SIGTERM)
    try:
        requeue_slurm_job("77")
        assert record.read_text() == "requeue 77\n"
        assert "Requeuing SLURM job 77: it continues from last.ckpt" in capsys.readouterr().err
        (tmp_path / "bin" / "scontrol").write_text(
            "#!/bin/sh\necho 'Requested operation is disabled' >&2\nexit 1\n"
        )
        requeue_slurm_job("77")
        assert (
            "warning: scontrol requeue 77 failed (Requested operation is disabled): resubmit the job"
            in capsys.readouterr().err
        )
    finally:
        signal.signal(signal.SIGTERM, before)  # the requeue ignores SIGTERM: this process is not exiting


# -- 2 DDP processes started as SLURM tasks, one of them signalled ---------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """3 classes x 40 images: 14 training batches of 4 per process and epoch."""
    return make_image_folder(
        tmp_path_factory.mktemp("images") / "images", classes=3, per_class=40, extras=False
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_config(folder: Path) -> Path:
    path = folder / "probe.yaml"
    probe = {"class_path": "tests.slurm.probe.StepProbe", "init_args": {"folder": str(folder)}}
    path.write_text(yaml.safe_dump({"trainer": {"callbacks+": [probe]}}))
    return path


def fit_args(images: Path, folder: Path, *configs: Path, epochs: int = 6) -> list[str]:
    """A short CPU fit of SimpleCNN on the image folder, on 2 processes (DDP, gloo)."""
    args = [
        "fit", "--config", CONFIGS / "folder.yaml", "--config", CONFIGS / "trainer" / "ddp_cpu.yaml",
        *[a for c in configs for a in ("--config", c)], "--config", probe_config(folder),
        "--model.net", "SimpleCNN", "--data.root", images, "--data.cache_dir", images.parent / "cache",
        "--data.image_size", "32", "--data.batch_size", "4", "--trainer.max_epochs", epochs,
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    return [str(a) for a in args]


def start_signalled_run(
    images: Path,
    folder: Path,
    rank: int,
    after: int,
    rng: random.Random,
    *configs: Path,
    signum: int = signal.SIGUSR1,
):
    folder.mkdir()
    args = fit_args(images, folder, *configs)
    args += ["--trainer.default_root_dir", str(folder / "logs"), "--trainer.logger", "false"]
    bin_dir = fake_scontrol(folder / "bin", folder / "scontrol.txt")
    step = start_step(
        [*args, "--trainer.num_nodes", "1", "--trainer.devices", "2"], 2, free_port(), folder, bin_dir
    )
    sent = signal_after_step(step, folder, rank, after, rng, timeout=180, signum=signum)
    return step, sent


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(2))
def test_sigusr1_to_one_ddp_rank_stops_both_at_the_same_step(images, tmp_path, trial):
    rng = random.Random(trial)
    rank, after = trial % 2, rng.randrange(2, 40)  # somewhere in the first 3 of 6 epochs
    step, sent = start_signalled_run(images, tmp_path / "run", rank, after, rng)  # on by default under SLURM
    codes = step.wait(timeout=120)
    assert codes == [143, 143], (
        f"signalled rank {rank} after step {sent}: exit codes {codes}\n{step.output()}"
    )
    stops = [int((tmp_path / "run" / f"rank{r}.stop").read_text()) for r in range(2)]
    assert stops[0] == stops[1] >= sent, (stops, sent)
    ckpt = next((tmp_path / "run" / "logs").glob("runs/version_*/checkpoints/last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["global_step"] == stops[0]
    assert (tmp_path / "run" / "scontrol.txt").read_text() == f"requeue {JOB_ID}\n"  # rank 0, once
    assert "error: stopped by SIGUSR1; resume with the same command plus --ckpt_path last" in step.output()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_or_ctrl_c_to_one_ddp_rank_stops_both_at_the_same_step_without_a_requeue(
    images, tmp_path, signum
):
    # Lightning alone stops the signalled process at the end of its batch while the other waits for it in the
    # next gradient all-reduce: the run hangs. (`kill PID`, a terminal's Ctrl-C reaching one process.)
    rng = random.Random(signum)
    step, sent = start_signalled_run(images, tmp_path / "run", 1, rng.randrange(2, 40), rng, signum=signum)
    codes = step.wait(timeout=120)
    expected = 128 + signum
    assert codes[1] == expected and codes[0] in (expected, 143), (
        f"after step {sent}: exit codes {codes}\n{step.output()}"
    )
    stops = [int((tmp_path / "run" / f"rank{r}.stop").read_text()) for r in range(2)]
    assert stops[0] == stops[1] >= sent, (stops, sent)
    ckpt = next((tmp_path / "run" / "logs").glob("runs/version_*/checkpoints/last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["global_step"] == stops[0]
    assert not (tmp_path / "run" / "scontrol.txt").exists()  # SIGTERM means stop, not preemption
    assert "--ckpt_path last" in step.output() and "Received SIGTERM" not in step.output()


@pytest.mark.slow
def test_lightnings_own_slurm_handler_hangs_when_one_rank_is_signalled(images, tmp_path):
    """What the callback replaces: Lightning's auto-requeue handler saves a checkpoint (collectives) inside the
    signal handler, on the signalled process alone, so the processes wait for each other for ever."""
    own = tmp_path / "lightnings_own.yaml"
    plugin = {"class_path": "lightning.pytorch.plugins.environments.SLURMEnvironment"}
    own.write_text(yaml.safe_dump({"trainer": {"plugins": [plugin | {"init_args": {"auto_requeue": True}}]}}))
    step, sent = start_signalled_run(images, tmp_path / "run", 1, 10, random.Random(0), own)
    codes = step.wait(timeout=15)  # the callback's stop takes well under a second
    assert codes == [None, None], f"expected both processes still waiting, got exit codes {codes}"
    assert not (tmp_path / "run" / "scontrol.txt").exists()


# -- a real SLURM job: tests/slurm/start_cluster.sh ----------------------------------------------------------


def slurm_unavailable() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed (CI starts a one-node cluster with tests/slurm/start_cluster.sh)"
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%t %c"], capture_output=True, text=True, timeout=30)
    idle = [
        int(cpus) for state, cpus in (line.split() for line in nodes.stdout.splitlines()) if state == "idle"
    ]
    if nodes.returncode != 0 or not idle:
        return f"no idle SLURM node (sinfo: {(nodes.stdout + nodes.stderr).strip() or 'none'}); see start_cluster.sh"
    if max(idle) < 2:
        return "the idle SLURM nodes have 1 CPU: the job needs 2 tasks on one node"
    return None


def job_state(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30
    )
    return dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)


def wait_for_job(job_id: str, log: Path, until, what: str, timeout: float) -> dict[str, str]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = job_state(job_id)
        if until(state):
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], timeout=30)
    text = log.read_text()[-6000:] if log.exists() else "(no log)"
    raise AssertionError(f"job {job_id}: {what} not reached in {timeout}s; last state {state}\n{text}")


@pytest.mark.slow
def test_a_preempted_slurm_job_is_requeued_and_finishes_the_same_run(images, tmp_path):
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    epochs, log = 4, tmp_path / "job.out"
    args = fit_args(images, tmp_path, epochs=epochs) + ["--trainer.default_root_dir", str(tmp_path / "logs")]
    args = args[args.index("--model.net") :]  # the sbatch script passes its own configs (CONFIG, STRATEGY)
    probe = ["--config", str(probe_config(tmp_path))]
    env = {**subprocess_env(), "CONFIG": "configs/folder.yaml", "STRATEGY": "configs/trainer/ddp_cpu.yaml"}
    submit = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node", "0", "--nodes", "1", "--ntasks-per-node", "2",
         "--cpus-per-task", "1", "--time", "10", "--output", str(log), "--chdir", str(ROOT),
         str(CONFIGS / "slurm" / "train.sbatch"), *probe, *args],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    job_id = submit.stdout.strip().split(";")[0]
    try:
        # Preempted in its second epoch, as SLURM's --signal=USR1@N would, to every task of the job step.
        end = time.monotonic() + 240
        while not (tmp_path / "rank0.step").exists() or int((tmp_path / "rank0.step").read_text() or 0) < 18:
            assert time.monotonic() < end and job_state(job_id).get("JobState") in ("PENDING", "RUNNING"), (
                log.read_text() if log.exists() else job_state(job_id)
            )
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=30)
        state = wait_for_job(
            job_id, log, lambda s: s.get("JobState") == "COMPLETED", "completion after a requeue", timeout=400
        )
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    text = log.read_text()
    assert int(state["Restarts"]) >= 1, text
    # The log of every start, kept whole (--open-mode=append), in order.
    first, second = text.find("restarts so far: 0"), text.find("restarts so far: 1")
    stop = text.find("error: stopped by SIGUSR1")
    assert 0 <= first < stop < second, text
    assert f"Requeuing SLURM job {job_id}" in text
    # One run, continued in place: one metrics.csv with every epoch's validation once, steps as if never stopped.
    runs = list((tmp_path / "logs" / "runs").glob("version_*"))
    assert [r.name for r in runs] == ["version_0"], text
    with open(runs[0] / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val = [row for row in rows if row.get("val/loss")]
    assert [int(row["epoch"]) for row in val] == list(range(epochs)), text
    steps_per_epoch = (int(val[1]["step"]) + 1) // 2
    assert [int(row["step"]) + 1 for row in val] == [steps_per_epoch * (e + 1) for e in range(epochs)]
    final = torch.load(runs[0] / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert final == steps_per_epoch * epochs
    # The same W&B run, continued: one offline folder per start, all with the run's id.
    wandb_runs = sorted(p.name for p in (tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == int(state["Restarts"]) + 1, wandb_runs
    assert len({name.rsplit("-", 1)[1] for name in wandb_runs}) == 1, wandb_runs
