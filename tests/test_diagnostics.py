"""Training diagnostics: gradient norms, update ratios, data wait, throughput, and the non-finite guard."""

import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from project.callbacks import (
    DataWaitMonitor,
    GradientNormMonitor,
    ImageThroughputMonitor,
    NonFiniteError,
    NonFiniteGuard,
    UpdateRatioMonitor,
)
from project.callbacks.diagnostics.data_wait import advice
from project.cli import main
from project.run.checkpoints import load_checkpoint
from tests.callback_fit import make_data, make_model, make_trainer, read_metrics
from tests.conftest import CONFIGS


def test_diagnostics_are_logged(fake_cifar, tmp_path):
    throughput = ImageThroughputMonitor(window_size=2)
    callbacks = [GradientNormMonitor(), UpdateRatioMonitor(), DataWaitMonitor(min_batches=2), throughput]
    model = make_model()
    make_trainer(tmp_path, callbacks, max_epochs=1).fit(model, make_data(fake_cifar))
    rows = read_metrics(tmp_path)

    def values(key):
        return [float(r[key]) for r in rows if r.get(key)]

    assert len(values("grad_norm/total")) == 8  # every step (log_every_n_steps=1), 8 batches
    layers = [k for k in rows[0] if k.startswith("grad_norm/net.")]
    assert "grad_norm/net.features.0.weight" in layers and "grad_norm/net.classifier.4.bias" in layers
    last = next(r for r in reversed(rows) if r.get("grad_norm/total"))
    total = sum(float(last[k]) ** 2 for k in layers) ** 0.5  # the total is the norm of all gradients together
    assert float(last["grad_norm/total"]) == pytest.approx(total, rel=1e-4)

    ratios = values("update_ratio/net.features.0.weight")
    assert len(ratios) == 8 and all(0 < r < 1 for r in ratios)  # AdamW at 3e-3 on a fresh net: 1e-3..1e-1
    assert not any(k.startswith("update_ratio/") and k.endswith("bias") for k in rows[0])

    waits = values("train/data_wait_step")
    assert len(waits) == 7 and all(0 <= w < 1 for w in waits)  # the first batch of the epoch is left out
    assert 0 <= values("train/data_wait_epoch")[0] < 1

    assert all(v > 0 for v in values("train/samples_per_sec"))
    assert model.flops_per_batch > 0  # counted on the meta device, for a batch of 50


def test_update_ratio_warns_naming_the_layers_outside_the_band(fake_cifar, tmp_path):
    monitor = UpdateRatioMonitor(healthy=(1e-9, 1e-8), measure="lr_grad")
    with pytest.warns(UserWarning, match=r"4 layer\(s\).*net\.features\.0\.weight \(\d"):
        make_trainer(tmp_path, [monitor], max_epochs=1).fit(make_model(), make_data(fake_cifar))


class SlowImages(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int):
        time.sleep(0.05)  # like decoding a large JPEG on one worker (long enough to dominate under load)
        return torch.randn(3, 32, 32), index % 10


def test_data_wait_warns_when_training_is_data_bound(tmp_path):
    loader = DataLoader(SlowImages(), batch_size=8)
    trainer = make_trainer(tmp_path, [DataWaitMonitor(min_batches=3)], max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match="training is data-bound: .* waits for the next batch"):
        trainer.fit(make_model(), train_dataloaders=loader)


def test_data_wait_advice_names_the_settings(fake_cifar):
    text = advice(make_data(fake_cifar))
    assert "--data.num_workers, now auto" in text and "--data.on_device true" in text


class FailAt(nn.Module):
    """Wraps a network; at training forward number `at` its output goes NaN, or its gradient infinite."""

    def __init__(self, net: nn.Module, at: int, mode: str) -> None:
        super().__init__()
        self.net, self.at, self.mode, self.calls = net, at, mode, 0

    def forward(self, x):
        if self.training:
            self.calls += 1
        if self.calls != self.at or not self.training:
            return self.net(x)
        if self.mode == "nan":
            return self.net(x) * float("nan")
        features = InfGradient.apply(self.net.features(x))
        return self.net.classifier(features)


class InfGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


@pytest.mark.parametrize("mode", ["nan", "inf_grad"])
def test_non_finite_stops_training_names_step_and_layer_and_saves_nothing_broken(mode, fake_cifar, tmp_path):
    model = make_model()
    model.net = FailAt(model.net, at=11, mode=mode)  # epoch 1 (8 batches per epoch), batch 2
    trainer = make_trainer(tmp_path, [NonFiniteGuard()], max_epochs=3)
    expected = "loss is nan" if mode == "nan" else "loss is finite but gradients are not"
    with pytest.raises(NonFiniteError, match=rf"global step 10 \(epoch 1, batch 2\): {expected}") as error:
        trainer.fit(model, make_data(fake_cifar))
    assert "first layer with a non-finite gradient: net.net.features.0.weight" in str(error.value)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the broken update was not applied
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["epoch=0-step=8.ckpt", "last.ckpt"]
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 8
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


def test_a_checkpoint_of_non_finite_weights_is_refused():
    trainer = SimpleNamespace(global_step=7, current_epoch=1)
    state = {"net.fc.weight": torch.tensor([1.0, float("inf")]), "net.fc.num_batches": torch.tensor(3)}
    with pytest.raises(NonFiniteError, match="net.fc.weight is NaN or infinite"):
        NonFiniteGuard().on_save_checkpoint(trainer, None, {"state_dict": state})


def test_the_cli_stops_a_diverging_run_with_one_line(fake_cifar, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit", "--config", str(CONFIGS / "cifar10.yaml"), "--model.net", "SimpleCNN",
                "--model.scheduler", "null", "--model.optimizer.lr", "1e38", "--model.label_smoothing", "0",
                "--data.data_dir", str(fake_cifar), "--data.download", "false", "--data.val_size", "100",
                "--data.batch_size", "50", "--trainer.precision", "32-true", "--trainer.max_epochs", "1",
                "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                "--trainer.default_root_dir", str(tmp_path),
            ]
        )  # fmt: skip
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "training stopped at global step" in lines[0] and "Traceback" not in err
    assert not list(tmp_path.rglob("*.ckpt"))
