"""Gradient clipping and accumulation presets, the global batch size and the effective-batch-size report."""

import logging
from pathlib import Path

import pytest
import torch
import yaml

from project.cli import Run, build, main, run_command
from tests.conftest import CONFIGS
from tests.probes import GradientProbe
from tests.tiny_runs import fit_args, tiny_cifar

TRAINER = CONFIGS / "trainer"


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    return tiny_cifar(tmp_path_factory.mktemp("tiny_cifar"))


@pytest.fixture
def lightning_log():
    """The messages Lightning's rank-zero logger prints (it does not propagate to pytest's handlers)."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


QUIET = [
    "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
    "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
]  # fmt: skip


def run(cifar: Path, tmp_path: Path, *args: object) -> Run:
    return run_command(fit_args(cifar, tmp_path, *QUIET, *args))


@pytest.mark.parametrize(("preset", "stat"), [("clip_norm.yaml", "norm"), ("clip_value.yaml", "max")])
def test_clipping_bounds_what_the_optimizer_sees(preset, stat, cifar, tmp_path):
    algorithm = yaml.safe_load((TRAINER / preset).read_text())["trainer"]["gradient_clip_algorithm"]
    # A limit well below this net's gradients at initialisation, so that clipping must act in every step.
    limit = {"norm": 0.05, "max": 0.002}[stat]
    cli = run(
        cifar, tmp_path, "--config", TRAINER / preset, "--trainer.gradient_clip_val", limit,
        "--data.batch_size", "8", "--trainer.max_steps", "4",
        "--trainer.callbacks+=tests.probes.GradientProbe",
    )  # fmt: skip
    assert cli.trainer.gradient_clip_algorithm == algorithm
    probe = next(c for c in cli.trainer.callbacks if isinstance(c, GradientProbe))
    assert len(probe.before) == len(probe.seen) == 4
    assert all(step[stat] > limit for step in probe.before)  # the limit was binding...
    assert all(step[stat] <= limit * (1 + 1e-4) for step in probe.seen)  # ...and held (float32 sums)
    if stat == "norm":  # clipping by norm rescales: the norm lands on the limit, the direction is kept
        assert all(step["norm"] == pytest.approx(limit, rel=1e-4) for step in probe.seen)


def test_k_micro_batches_update_like_one_batch_of_k_times_b(cifar, tmp_path, lightning_log):
    """4 accumulated batches of 8 and one batch of 32 give the same weights (2 optimizer steps, SGD)."""
    common = ["--data.global_batch_size", "32", "--trainer.max_steps", "2"]
    accumulated = run(cifar, tmp_path / "a", *common, "--config", TRAINER / "accumulate.yaml")
    assert accumulated.datamodule.batch_size == 8 and accumulated.trainer.accumulate_grad_batches == 4
    assert accumulated.trainer.fit_loop.total_batch_idx == 7  # 8 micro-batches for 2 steps
    assert any(
        "Effective batch size: 32 samples per optimizer step = 8 per device x 1 device(s) x 1 node(s) x "
        "4 accumulated batch(es)" in message
        for message in lightning_log
    )
    whole = run(cifar, tmp_path / "b", *common)
    assert whole.datamodule.batch_size == 32 and whole.trainer.global_step == 2

    a, b = accumulated.model.net.state_dict(), whole.model.net.state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    # The comparison has teeth: both runs moved the weights far more than the tolerance.
    start = build(fit_args(cifar, tmp_path / "c", *QUIET, *common)[1:]).model.net.state_dict()
    assert (b["classifier.4.weight"] - start["classifier.4.weight"]).abs().max() > 1e-3


def test_global_batch_size_that_does_not_divide_is_one_clear_error(cifar, tmp_path, capsys):
    args = fit_args(
        cifar, tmp_path, *QUIET, "--config", TRAINER / "accumulate.yaml", "--data.global_batch_size", "30"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert (
        "error: data.global_batch_size=30 does not divide into 1 process(es) x 4 accumulated batch(es)" in err
    )
    assert "Traceback" not in err
