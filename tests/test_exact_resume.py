"""Exact resume: a run stopped by SIGTERM in the middle of an epoch and continued with `--ckpt_path last` ends
with the very weights of the run never stopped (same batches in the same order, same augmentation draws).

The building blocks and the first whole runs stop from a callback that sends this process SIGTERM after a given
step; the runs of every shipped config, as users run it (its scheduler, precision, augmentation, EMA, loader
workers), are stopped from outside at random moments: inside the sanity check, a step, a validation or a
checkpoint write (tests/resume_moments.py; benchmarks/resume_moments.py tries many more moments). The resumed
command is the same one plus `--ckpt_path last`.
"""

import os
import random
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

from project.cli import main
from project.data.samplers import ResumableLoader, ResumableSampler, ShardSampler
from tests.conftest import CONFIGS, run_cli
from tests.resume_moments import (
    TinyData,
    check_stops,
    choose_moments,
    make_tiny_data,
    shipped_configs,
    stopped_run,
    whole_run,
)

STOP_AT = 16 + 5  # 400 training images in batches of 25: the 6th step of the second epoch


class TermAfterStep(Callback):
    """Sends the rank-0 process `signal_name` at the end of training step `step` of a run that did not resume."""

    def __init__(self, step: int = STOP_AT, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signal_name = signal_name

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.ckpt_path is None and trainer.global_step == self.step and trainer.is_global_zero:
            os.kill(os.getpid(), signal.Signals[self.signal_name])


def fit_args(
    data: Path, root: Path, *extra: object, stop: int = STOP_AT, signal_name: str = "SIGTERM"
) -> list[str]:
    args = [
        "fit", "--config", CONFIGS / "cifar10.yaml",
        "--model.net", "project.models.SimpleCNN", "--model.net.init_args.width", "8",
        "--model.optimizer", "AdamW", "--model.optimizer.init_args.lr", "0.003", "--model.scheduler", "null",
        "--data.data_dir", data, "--data.download", "false", "--data.val_size", "100", "--data.batch_size", "25",
        "--data.augment.cutout", "8",  # crop, flip and Cutout: augmentation draws every step
        "--trainer.precision", "32-true", "--trainer.max_epochs", "3", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.limit_val_batches", "2", "--trainer.default_root_dir", root,
        "--trainer.callbacks+=tests.test_exact_resume.TermAfterStep",
        "--trainer.callbacks.step", stop, "--trainer.callbacks.signal_name", signal_name, *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


def last_weights(root: Path) -> dict[str, torch.Tensor]:
    (last,) = root.glob("runs/version_*/checkpoints/last.ckpt")
    return torch.load(last, weights_only=True)["state_dict"]


def assert_same_weights(stopped: dict[str, torch.Tensor], whole: dict[str, torch.Tensor]) -> None:
    assert stopped.keys() == whole.keys()
    different = [k for k in whole if not torch.equal(stopped[k], whole[k])]
    worst = max((float((stopped[k] - whole[k]).abs().max()) for k in different), default=0.0)
    assert not different, f"{len(different)} tensors differ (max |diff| {worst:.3g}): {different[:5]}"


def stop_and_resume(args: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 128 + signal.SIGTERM
    main([*args, "--ckpt_path", "last"])


# -- the building blocks -----------------------------------------------------------------------------------


def test_resumable_sampler_continues_the_epoch_it_stopped_in():
    data = TensorDataset(torch.arange(10))
    whole = ResumableLoader(data, ResumableSampler(data, seed=3), batch_size=2)
    whole.sampler.set_epoch(1)
    expected = [b[0].tolist() for b in whole]
    stopped = ResumableLoader(data, ResumableSampler(data, seed=3), batch_size=2)
    stopped.sampler.set_epoch(1)
    it = iter(stopped)
    seen = [next(it)[0].tolist(), next(it)[0].tolist()]
    state = stopped.state_dict()
    assert state == {"epoch": 1, "consumed": 4, "seed": 3}
    resumed = ResumableLoader(data, ResumableSampler(data, seed=0), batch_size=2)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)  # what Lightning does at the epoch's start: the position is kept
    assert seen + [b[0].tolist() for b in resumed] == expected
    assert resumed.state_dict() == {"epoch": 2, "consumed": 0, "seed": 3}  # the epoch is over
    assert len(resumed) == 5


def test_the_epoch_set_after_the_iterator_is_created_counts():
    # Lightning creates the first iterator of a run resumed from an end-of-epoch checkpoint before it calls
    # set_epoch; worker processes must not have read the sampler by then.
    data = TensorDataset(torch.arange(8))
    loader = ResumableLoader(data, ResumableSampler(data, seed=1), batch_size=4, num_workers=2)
    batches = iter(loader)
    loader.sampler.set_epoch(1)
    assert torch.cat([b[0] for b in batches]).tolist() == loader.sampler.order()


def test_resumable_sampler_deals_the_order_to_the_processes():
    data = TensorDataset(torch.arange(11))
    order = ResumableSampler(data, seed=5).order()
    shards = [list(ResumableSampler(data, 2, rank, seed=5, drop_last=True)) for rank in (0, 1)]
    assert shards[0] == order[0:10:2] and shards[1] == order[1:10:2]
    resumed = ResumableSampler(data, 2, 1, seed=5, drop_last=True)
    resumed.skip(4)  # two batches of 2 per process were consumed
    assert list(resumed) == order[5:10:2]


def test_shard_sampler_gives_whole_batches_once():
    data = TensorDataset(torch.arange(7))
    shards = [list(ShardSampler(data, 2, 3, rank)) for rank in range(3)]
    assert shards == [[0, 1, 6], [2, 3], [4, 5]]
    assert [len(ShardSampler(data, 2, 3, rank)) for rank in range(3)] == [3, 2, 2]


# -- whole runs ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_stopped_mid_epoch_resumes_bit_identical(fake_cifar, tmp_path, workers):
    # TrivialAugment: per-image random draws in the loader workers too.
    extra = ["--data.num_workers", workers, "--data.augment.trivial_augment", "true"]
    stop_and_resume(fit_args(fake_cifar, tmp_path / "stopped", *extra))
    main(fit_args(fake_cifar, tmp_path / "whole", *extra, stop=-1))  # the same run, never stopped
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


@pytest.mark.slow
def test_zero_and_two_workers_train_identically(fake_cifar, tmp_path):
    extra = ["--data.augment.trivial_augment", "true", "--trainer.max_epochs", "1"]
    for workers in (0, 2):
        main(fit_args(fake_cifar, tmp_path / str(workers), *extra, "--data.num_workers", workers, stop=-1))
    assert_same_weights(last_weights(tmp_path / "0"), last_weights(tmp_path / "2"))


def folder_args(images: Path, root: Path, stop: int = 8 + 3) -> list[str]:
    args = fit_args(Path("unused"), root, stop=stop)
    cifar = {"--data.data_dir", "--data.download", "--data.val_size"}
    kept = [a for i, a in enumerate(args) if a not in cifar and (i == 0 or args[i - 1] not in cifar)]
    folder = ["--data", "ImageFolderDataModule", "--data.root", images, "--data.image_size", "16",
              "--data.cache", "true", "--data.cache_dir", root / "cache", "--data.skip_corrupt", "true",
              "--data.batch_size", "4"]  # fmt: skip
    return [*kept, *map(str, folder)]


@pytest.mark.slow
def test_a_folder_run_stopped_mid_epoch_resumes_bit_identical(image_folder, tmp_path):
    # Each run builds its own image cache: building one draws from the global generator (its decoding loader).
    # 36 images, 4 held out: 32 in batches of 4 is 8 steps an epoch; the stop comes at step 11.
    stop_and_resume(folder_args(image_folder, tmp_path / "stopped"))
    main(folder_args(image_folder, tmp_path / "whole", stop=-1))
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


@pytest.mark.slow
def test_a_run_of_one_batch_epochs_stops_and_resumes_bit_identical(image_folder, tmp_path):
    # The 32 training images in one batch: every batch ends its epoch, so there is no batch for the stop to
    # wait for that does not (the run used to ignore SIGTERM to its end). The signal after step 1 waits for that
    # epoch's validation and the next batch, and the run stops at the end of that batch's epoch, step 2.
    def args(root: Path, stop: int) -> list[str]:
        return [*folder_args(image_folder, root, stop=stop), "--data.batch_size", "32", "--trainer.max_epochs", "4"]  # fmt: skip

    with pytest.raises(SystemExit) as stopped:
        main(args(tmp_path / "stopped", 1))
    assert stopped.value.code == 128 + signal.SIGTERM
    (last,) = (tmp_path / "stopped").glob("runs/version_*/checkpoints/last.ckpt")
    # last.ckpt was saved after the second epoch's validation
    assert torch.load(last, weights_only=True)["global_step"] == 2
    main([*args(tmp_path / "stopped", 1), "--ckpt_path", "last"])
    main(args(tmp_path / "whole", -1))
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


@pytest.mark.slow
def test_a_ddp_run_stopped_mid_epoch_resumes_bit_identical(fake_cifar, tmp_path):
    # Two gloo processes: 8 steps of 2 x 25 images an epoch; the stop comes at step 11, as a preemption warning
    # to rank 0 that StopAndRequeue makes every process act on at the same step. Each process restores its own
    # random generators.
    ddp = ["--config", CONFIGS / "trainer" / "ddp_cpu.yaml",
           "--trainer.callbacks+=project.callbacks.preemption.StopAndRequeue", "--trainer.callbacks.requeue", "false"]  # fmt: skip
    stopped = fit_args(fake_cifar, tmp_path / "stopped", *ddp, stop=8 + 3, signal_name="SIGUSR1")
    out = run_cli(*stopped, cwd=tmp_path, check=False)
    assert out.returncode == 128 + signal.SIGTERM, out.stderr[-4000:]
    run_cli(*stopped, "--ckpt_path", "last", cwd=tmp_path)
    run_cli(*fit_args(fake_cifar, tmp_path / "whole", *ddp, stop=-1, signal_name="SIGUSR1"), cwd=tmp_path)
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


# -- every shipped config, stopped from outside at random moments --------------------------------------------

#: Random moments each config is stopped at in the test tier (benchmarks/resume_moments.py tries many more).
MOMENTS = 3


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> TinyData:
    return make_tiny_data(tmp_path_factory.mktemp("shipped"))


def stopped_from_outside(config: str, data: TinyData, base: Path, ddp: bool = False) -> None:
    timeline = whole_run(config, data, base / "whole", ddp)
    rng = random.Random(f"{config}:{ddp}")  # seeded by the config: the same moments on every machine
    # Under DDP one moment is always in the sanity check, where Lightning's own handler is in place.
    moments = choose_moments(timeline, MOMENTS, rng, ranks=2 if ddp else 1, first=("sanity",) if ddp else ())
    print(f"{config}: stopped at {', '.join(map(str, moments))}")
    segments, differences = stopped_run(config, data, base / "stopped", moments, base / "whole", ddp)
    check_stops(segments)
    # The run waits for each signal (Progress) and each moment is one a stop can follow: every one stops it.
    assert [s.moment for s in segments if s.stopped] == moments, [
        (str(s.moment), s.returncode) for s in segments
    ]
    assert not differences, f"{len(differences)} differences after stops at {moments}: {differences[:8]}"


@pytest.mark.slow
@pytest.mark.parametrize("config", shipped_configs())
def test_every_shipped_config_stopped_from_outside_resumes_bit_identical(config, tiny_data, tmp_path):
    stopped_from_outside(config, tiny_data, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("config", [c for c in ("folder.yaml", "callbacks/ema.yaml", "streaming.yaml")
                                    if c in shipped_configs()])  # fmt: skip
def test_shipped_configs_under_ddp_stopped_from_outside_resume_bit_identical(config, tiny_data, tmp_path):
    # A signal to either process, at a random moment of either one's step: both stop after the same batch.
    stopped_from_outside(config, tiny_data, tmp_path, ddp=True)
