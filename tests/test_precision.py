"""Precision presets: bf16-mixed trains and resumes on the CPU; 16-mixed's GradScaler state survives a resume."""

import os
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from project.cli import Run, build, run_command
from project.models import SimpleCNN
from project.tasks import ImageClassifier
from tests.conftest import CONFIGS, newest_run, run_cli
from tests.probes import ForwardDtype, ScalerAtStart
from tests.tiny_runs import fit_args, tiny_cifar

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    return tiny_cifar(tmp_path_factory.mktemp("tiny_cifar"))


def cli_fit(args: list[str], *extra: str) -> Run:
    """`python -m project fit ...` in this process, with a ForwardDtype probe; returns the CLI (and its trainer)."""
    return run_command([*args, *extra, "--trainer.callbacks+=tests.probes.ForwardDtype"])


def probe(cli: Run, kind: type) -> Callback:
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))


def test_bf16_preset_trains_and_resumes_on_cpu(cifar, tmp_path):
    common = [
        "--config", CONFIGS / "trainer" / "bf16.yaml", "--trainer.accelerator", "cpu", "--trainer.devices", "1",
        "--data.batch_size", "8", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--trainer.logger", "false",
    ]  # fmt: skip
    first = cli_fit(fit_args(cifar, tmp_path, *common, "--trainer.max_epochs", "1"))
    assert first.trainer.precision == "bf16-mixed" and probe(first, ForwardDtype).dtypes == {torch.bfloat16}
    ckpt = newest_run(tmp_path) / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 2 and saved["state_dict"]["net.classifier.4.weight"].dtype == torch.float32

    second = cli_fit(
        fit_args(cifar, tmp_path, *common, "--trainer.max_epochs", "2"), "--ckpt_path", str(ckpt)
    )
    assert probe(second, ForwardDtype).dtypes == {torch.bfloat16}
    assert second.trainer.global_step == 4 and second.trainer.current_epoch == 2  # continued, not restarted
    # An explicit checkpoint starts a new run folder from that state (a branch): its own last.ckpt.
    resumed = torch.load(
        newest_run(tmp_path) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert resumed["global_step"] == 4
    assert not torch.equal(
        resumed["state_dict"]["net.classifier.4.weight"], saved["state_dict"]["net.classifier.4.weight"]
    )


def test_fp16_preset_trains_in_32_bit_on_a_cpu_with_one_notice(tmp_path, capsys):
    # Lightning would fall back to bf16, which CPUs without native bf16 emulate slowly; and say so in a warning.
    args = ["--config", str(CONFIGS / "cifar10.yaml"), "--config", str(CONFIGS / "trainer" / "fp16.yaml")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = build([*args, "--trainer.accelerator", "cpu", "--trainer.logger", "false"])
    # No Python warning about it (Lightning's bf16 fallback, the srun hint of a login node), only the notice.
    assert not [w for w in caught if "precision" in str(w.message) or "srun" in str(w.message)]
    assert cli.trainer.precision == "32-true"
    assert capsys.readouterr().err.count("warning: trainer.precision 16-mixed needs a CUDA GPU") == 1
    cli = build([*args, "--config", str(CONFIGS / "trainer" / "fp32.yaml"), "--trainer.logger", "false"])
    assert cli.trainer.precision == "32-true"


def scaler_trainer(tmp_path: Path, max_steps: int, probe: Callback) -> L.Trainer:
    # fp16 autocast and a GradScaler on the CPU (Lightning only offers them on GPUs, but the plugin and the
    # checkpoint logic are the same). The scale doubles after every finite step: its value counts steps.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    return L.Trainer(
        accelerator="cpu",
        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        max_steps=max_steps,
        callbacks=[probe],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )


def test_fp16_scaler_state_is_checkpointed_and_restored(tmp_path):
    data = TensorDataset(torch.randn(32, 3, 32, 32), torch.randint(0, 3, (32,)))

    def fit(max_steps: int, ckpt_path: Path | None = None) -> tuple[L.Trainer, ScalerAtStart]:
        probe = ScalerAtStart()
        trainer = scaler_trainer(tmp_path, max_steps, probe)
        model = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, input_shape=None)
        trainer.fit(model, DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
        return trainer, probe

    trainer, probe = fit(3)
    assert probe.scale == 2.0**10
    ckpt = tmp_path / "scaler.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["MixedPrecision"]
    assert state["scale"] == 2.0**13  # three finite steps, each doubling it

    trainer, probe = fit(5, ckpt_path=ckpt)  # a fresh scaler (2**10) is replaced by the checkpoint's
    assert probe.scale == 2.0**13
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**15


@pytest.mark.gpu
@cuda
def test_fp16_preset_scaler_round_trip_on_gpu(cifar, tmp_path):
    common = [
        "--config", CONFIGS / "trainer" / "fp16.yaml", "--trainer.accelerator", "gpu", "--trainer.devices", "1",
        "--data.batch_size", "8", "--trainer.limit_train_batches", "3", "--trainer.logger", "false",
    ]  # fmt: skip
    run_cli(*fit_args(cifar, tmp_path, *common, "--trainer.max_epochs", "1"), cwd=tmp_path)
    ckpt = newest_run(tmp_path) / "checkpoints" / "last.ckpt"
    scale = torch.load(ckpt, map_location="cpu", weights_only=True)["MixedPrecision"]["scale"]
    assert scale > 0
    args = fit_args(cifar, tmp_path, *common, "--trainer.max_epochs", "2", "--ckpt_path", ckpt)
    cli = run_command([*args, "--trainer.callbacks+=tests.probes.ScalerAtStart"])
    assert probe(cli, ScalerAtStart).scale == scale


def test_no_srun_hint_outside_a_slurm_job(tmp_path, monkeypatch, capsys):
    """A cluster's login node has `srun` on the PATH: outside a SLURM job no command hints at it."""
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{srun.parent}:{os.environ['PATH']}")
    for name in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(["--config", str(CONFIGS / "cifar10.yaml"), "--trainer.logger", "false"])
    assert not [w for w in caught if "srun" in str(w.message)] and "srun" not in capsys.readouterr().err
