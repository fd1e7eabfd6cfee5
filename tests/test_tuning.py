"""LR and batch-size finders from the CLI: a finite LR suggestion with its plot, a batch size that is a power of
two within its bounds, and both applied to the run when asked."""

import csv
import importlib.util
import logging
import math

import pytest
import torch
import wandb
from lightning.pytorch.callbacks import Callback

from project.callbacks.tuning.batch_size_finder import MaxBatchSizeFinder
from project.callbacks.tuning.lr_finder import LRFinder
from project.cli import Run, main, run_command
from project.models import MLP
from tests.conftest import CONFIGS
from tests.tiny_fit import command_args, readme_commands, tiny_args
from tests.wandb_reader import read_run

LR_FIND = "python -m project fit --config configs/cifar10.yaml --config configs/tuning/lr_find.yaml"
LR_FIND_APPLY = f"{LR_FIND} --trainer.callbacks.apply true"
BATCH_SIZE = "python -m project fit --config configs/cifar10.yaml --config configs/tuning/batch_size.yaml"
BATCH_SIZE_APPLY = f"{BATCH_SIZE} --trainer.callbacks.apply true"
COMMANDS = [LR_FIND, LR_FIND_APPLY, BATCH_SIZE, BATCH_SIZE_APPLY]


class MemoryBoundMLP(MLP):
    """The MLP, except that a training batch above `max_batch` fails as CUDA does when memory runs out."""

    def __init__(self, num_classes: int = 10, max_batch: int = 16, hidden: int = 32) -> None:
        super().__init__(num_classes=num_classes, hidden=hidden)
        self.max_batch = max_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > self.max_batch:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 8.00 GiB total)"
            )
        return super().forward(x)


class StopAfterFirstStep(Callback):
    """Ends training after one optimizer step (enough to see which batch size and schedule it used)."""

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.global_step >= 1  # with gradient accumulation, after several batches


def finder(cli: Run, kind: type) -> Callback:
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, kind)]
    return callback


def test_readme_tuning_commands_are_the_tested_ones():
    assert set(readme_commands("configs/tuning/")) <= set(COMMANDS)


def test_lr_finder_prints_a_finite_suggestion_and_saves_its_curve(fake_cifar, tmp_path, capsys):
    args = command_args(LR_FIND) + tiny_args(fake_cifar, tmp_path, logger=True)
    cli = run_command([*args, "--trainer.callbacks.num_training_steps", "24"])
    wandb.finish()  # flush the offline run before reading it back
    out = capsys.readouterr().out

    lr = finder(cli, LRFinder).suggestion
    assert lr is not None and math.isfinite(lr) and 1e-7 <= lr <= 1.0
    assert f"suggested learning rate {lr:.3g}" in out
    assert f"--model.optimizer.init_args.lr {lr:.3g} --model.scheduler.init_args.max_lr {lr:.3g}" in out
    run = tmp_path / "runs" / "version_0"
    with open(run / "lr_find.csv") as f:
        curve = [(float(row["lr"]), float(row["loss"])) for row in csv.DictReader(f)]
    results = finder(cli, LRFinder).optimal_lr.results  # every point recorded, as recorded
    assert curve == list(zip(results["lr"], results["loss"], strict=True)) and len(curve) > 12
    assert curve[0][0] < lr < curve[-1][0]
    with open(run / "metrics.csv") as f:
        assert float(next(csv.DictReader(f))["tuning/lr_suggestion"]) == pytest.approx(lr)
    (wandb_run,) = (tmp_path / "wandb").glob("offline-run-*")
    plots = list(wandb_run.glob("files/media/images/tuning/lr_find_*.png"))
    if importlib.util.find_spec("matplotlib") is None:  # the pinned environment: no `plots` extra
        assert f"curve: {run / 'lr_find.csv'} (for a plot, install matplotlib" in out
        assert not (run / "lr_find.png").exists() and plots == []
    else:
        plot = (run / "lr_find.png").read_bytes()
        assert plot.startswith(b"\x89PNG\r\n\x1a\n") and len(plot) > 10_000 and len(plots) == 1
    assert read_run(wandb_run, finished=True)["summary"]["tuning/lr_suggestion"] == pytest.approx(lr)
    # A tuning-only run: the model was restored and not trained, no checkpoint written.
    assert cli.trainer.global_step == 0 and not list(tmp_path.rglob("*.ckpt"))


def test_lr_finder_apply_trains_with_the_suggestion(fake_cifar, tmp_path, capsys):
    args = command_args(LR_FIND_APPLY) + tiny_args(fake_cifar, tmp_path)
    cli = run_command([*args, "--trainer.callbacks.num_training_steps", "20", "--trainer.max_epochs", "1"])
    lr = finder(cli, LRFinder).suggestion
    assert "Training continues with it" in capsys.readouterr().out
    # The whole epoch was trained, under a OneCycle schedule rebuilt around the suggestion.
    assert cli.trainer.global_step == 25
    (group, *_) = cli.trainer.optimizers[0].param_groups
    assert group["max_lr"] == pytest.approx(lr)
    assert cli.model.optimizer.keywords["lr"] == pytest.approx(lr)


def test_lr_finder_without_enough_batches_says_why(fake_cifar, tmp_path, capsys):
    # Stacked on the fast preset, the test gets 4 batches (limit_train_batches 4, max_epochs 1), not 100.
    fast = ["--config", str(CONFIGS / "debug" / "fast.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        main(command_args(LR_FIND) + fast + tiny_args(fake_cifar, tmp_path))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert (
        "error: LRFinder: no suggestion from 4 recorded losses" in err
        and "limit_train_batches x max_epochs" in err
    )


def test_batch_size_finder_returns_a_power_of_two_within_its_bounds(fake_cifar, tmp_path, capsys):
    args = command_args(BATCH_SIZE) + tiny_args(fake_cifar, tmp_path)
    cli = run_command([*args, "--trainer.callbacks.init_val", "4", "--trainer.callbacks.max_val", "32"])
    out = capsys.readouterr().out
    # On the CPU nothing runs out of memory: the search ends at max_val, and says why.
    assert finder(cli, MaxBatchSizeFinder).optimal_batch_size == 32
    assert "32 is the largest size tried (max_val=32 allows); the configured 16 fits" in out
    assert cli.trainer.global_step == 0 and cli.datamodule.batch_size == 32


def test_batch_size_finder_is_bounded_by_the_dataset(fake_cifar, tmp_path, capsys):
    args = command_args(BATCH_SIZE) + tiny_args(fake_cifar, tmp_path)
    lightning_log = logging.getLogger("lightning.pytorch.tuner.batch_size_scaling")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    lightning_log.addHandler(handler)
    try:
        cli = run_command(
            [*args, "--trainer.callbacks.init_val", "128", "--trainer.callbacks.max_val", "4096"]
        )
    finally:
        lightning_log.removeHandler(handler)
    # 400 training images: 256 is the largest power of two that is a whole batch.
    assert finder(cli, MaxBatchSizeFinder).optimal_batch_size == 256
    out = capsys.readouterr().out
    assert "256 is the largest size tried (the training set's size (400 images) allows)" in out
    # Lightning's own closing line names a size this finder does not keep (512, past the dataset).
    assert not [r for r in records if "will continue with full run" in r], records


@pytest.mark.slow
def test_batch_size_finder_after_oom_keeps_the_effective_batch(fake_cifar, tmp_path, capsys):
    args = command_args(BATCH_SIZE_APPLY) + tiny_args(fake_cifar, tmp_path, batch_size=64)
    args += [
        "--trainer.callbacks.init_val", "4", "--trainer.callbacks.max_val", "256",
        "--model.net", f"{__name__}.MemoryBoundMLP", "--model.net.max_batch", "16",
        "--trainer.max_epochs", "15", "--trainer.callbacks+", f"{__name__}.StopAfterFirstStep",
    ]  # fmt: skip
    cli = run_command(args)
    out = capsys.readouterr().out
    assert finder(cli, MaxBatchSizeFinder).optimal_batch_size == 16
    assert "16 is the largest size tried (fits in memory)" in out
    assert "--data.init_args.batch_size 16 --trainer.accumulate_grad_batches 4 (effective batch 64" in out
    # Training went on with 16 x 4 (a batch of 64 would have raised) ...
    assert cli.datamodule.batch_size == 16 and cli.trainer.accumulate_grad_batches == 4
    assert (
        cli.trainer.global_step == 1 and cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 4
    )
    # ... under a OneCycle schedule rebuilt for its step count: 15 epochs x ceil(25 batches / 4) = 105
    # (the configured 64 would have given 15 x 6 = 90, padded to 100).
    assert cli.trainer.lr_scheduler_configs[0].scheduler.total_steps == 105


def test_batch_size_finder_when_nothing_fits(fake_cifar, tmp_path, capsys):
    args = command_args(BATCH_SIZE) + tiny_args(fake_cifar, tmp_path)
    args += ["--model.net", f"{__name__}.MemoryBoundMLP", "--model.net.max_batch", "0"]
    with pytest.raises(SystemExit):
        main(args)
    assert "error: MaxBatchSizeFinder: even a batch of 1 runs out of memory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--trainer.callbacks.init_val", "3"], "init_val and max_val must be powers of two"),
        (["--trainer.callbacks.max_val", "1"], "init_val <= max_val"),
    ],
)
def test_batch_size_finder_bad_bounds(flags, message, fake_cifar, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(command_args(BATCH_SIZE) + tiny_args(fake_cifar, tmp_path) + flags)
    assert message in capsys.readouterr().err


def test_lr_finder_bad_range(fake_cifar, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(command_args(LR_FIND) + tiny_args(fake_cifar, tmp_path) + ["--trainer.callbacks.max_lr", "1e-8"])
    assert "error: LRFinder: need 0 < min_lr < max_lr" in capsys.readouterr().err
