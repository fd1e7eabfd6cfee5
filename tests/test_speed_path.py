"""The speed features: device-resident data, speed switches, the speed-run recipe (a few CPU batches)."""

import dataclasses

import numpy as np
import pytest
import torch

from project.data import CIFARDataModule
from project.data.tensor_dataset import TensorImageDataset
from project.models import SimpleCNN
from project.models.airbench import AirbenchNet
from project.tasks import ImageClassifier
from tests.conftest import CONFIGS, newest_run, run_cli


def test_tensor_dataset_to_device_reads_memmap_and_keeps_batches(tmp_path):
    images = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.uint8, shape=(10, 3, 4, 4))
    images[:] = np.arange(10, dtype=np.uint8)[:, None, None, None]
    images.flush()
    ds = TensorImageDataset(np.load(tmp_path / "x.npy", mmap_mode="r"), list(range(10)), indices=[9, 3, 5])
    before = ds.__getitems__([2, 0])
    ds.to("cpu")
    after = ds.__getitems__([2, 0])
    assert isinstance(ds.images, torch.Tensor)
    assert torch.equal(before[0], after[0]) and torch.equal(after[1], torch.tensor([5, 9]))


def test_channels_last_by_default_and_tta_flip():
    model = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, tta_flip=True)
    model.setup("fit")
    assert model.net.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    off = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, channels_last=False)
    off.setup("fit")
    assert off.net.features[0].weight.is_contiguous()  # NCHW when switched off
    model.eval()
    x = torch.randn(4, 3, 32, 32)
    expected = (model.net(x) + model.net(x.flip(-1))) / 2
    assert torch.allclose(model(x), expected, atol=1e-5)
    model.train()
    assert torch.allclose(model(x), model.net(x), atol=1e-5)  # no flip averaging while training


def test_tta_shift_averages_the_mirrored_and_shifted_views():
    torch.manual_seed(0)
    model = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, tta_flip=True, tta_shift=1).eval()
    x = torch.randn(2, 3, 32, 32)

    def both_ways(v):
        return (model.net(v) + model.net(v.flip(-1))) / 2

    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    expected = both_ways(x) / 2 + (both_ways(padded[..., :32, :32]) + both_ways(padded[..., 2:, 2:])) / 4
    assert torch.allclose(model(x), expected, atol=1e-5)
    assert not torch.allclose(model(x), both_ways(x), atol=1e-4)


def test_norm_biases_get_their_own_learning_rate_and_the_same_decay_per_step():
    from functools import partial

    net = AirbenchNet(num_classes=10, widths=(8, 16, 16))
    sgd = partial(torch.optim.SGD, lr=0.5, momentum=0.9, weight_decay=1e-3)
    schedule = partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.5, total_steps=10)
    model = ImageClassifier(
        net, optimizer=sgd, scheduler=schedule, weight_decay_norm_and_bias=True, norm_bias_lr_scale=64.0
    )
    config = model.configure_optimizers()
    groups = config["optimizer"].param_groups
    norm_biases = {id(m.bias) for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)}
    (scaled,) = [g for g in groups if g.get("lr_scale") == 64.0]
    assert {id(p) for p in scaled["params"]} == norm_biases
    others = [g for g in groups if g is not scaled]
    # OneCycle starts every group at max_lr / 25: the scaled group's own max_lr keeps it 64x faster.
    assert all(abs(scaled["lr"] - 64 * g["lr"]) < 1e-9 for g in others)
    assert all(
        abs(scaled["lr"] * scaled["weight_decay"] - g["lr"] * g["weight_decay"]) < 1e-12 for g in others
    )
    assert config["lr_scheduler"]["scheduler"].total_steps == 10


def test_whitening_bias_trains_only_its_first_epochs():
    from project.callbacks import PatchWhiteningInit

    net = AirbenchNet(num_classes=10, widths=(8, 16, 16))
    model = ImageClassifier(net)
    callback = PatchWhiteningInit(train_bias_epochs=3)

    class Trainer:
        current_epoch = 2

    net.whiten.bias.grad = torch.ones_like(net.whiten.bias)
    callback.on_before_optimizer_step(Trainer, model, None)
    assert net.whiten.bias.grad is not None
    Trainer.current_epoch = 3
    callback.on_before_optimizer_step(Trainer, model, None)
    assert net.whiten.bias.grad is None


def test_airbench_whitening_decorrelates_patches():
    net = AirbenchNet(num_classes=10)
    torch.manual_seed(0)
    x = torch.randn(32, 3, 32, 32) * torch.tensor([1.0, 2.0, 0.5])[:, None, None]
    x[..., 1:] += 0.8 * x[..., :-1]  # correlated neighbours, like real images
    net.init_whitening(x)
    out = net.whiten(x)[:, :12].permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = torch.cov(out.T)
    assert torch.allclose(cov, torch.eye(12, dtype=torch.float64), atol=0.02)
    assert not net.whiten.weight.requires_grad and net(x).shape == (32, 10)


@pytest.mark.slow
def test_speedrun_recipe_runs_on_cpu(fake_cifar, tmp_path):
    run_cli(
        "fit", "--config", CONFIGS / "experiment" / "cifar10_speedrun.yaml", "--config", CONFIGS / "debug.yaml",
        "--data.data_dir", fake_cifar, "--data.download", "false", "--data.val_size", "100", "--data.batch_size", "64",
        "--trainer.default_root_dir", tmp_path, "--trainer.limit_train_batches", "3",
        cwd=tmp_path,
    )  # fmt: skip
    ckpt = torch.load(newest_run(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)
    whiten = ckpt["state_dict"]["net.whiten.weight"]
    assert whiten.shape == (24, 3, 2, 2) and whiten.abs().sum() > 0  # set from the data, saved with the model
    assert ckpt["global_step"] == 3


def test_on_device_dataset_follows_the_trainer(fake_cifar):
    dm = CIFARDataModule(
        data_dir=str(fake_cifar), download=False, val_size=100, batch_size=16, on_device=True
    )

    class FakeTrainer:
        world_size = 1
        accumulate_grad_batches = 1

        class strategy:  # noqa: N801 - mimics trainer.strategy.root_device
            root_device = torch.device("cpu")

    dm.trainer = FakeTrainer()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 0 and not loader.pin_memory
    x, y = next(iter(loader))
    assert x.device.type == "cpu" and x.shape == (16, 3, 32, 32)
    # Alternating flips need each image's row: batches carry it, and leave the transform without it.
    dm.augment = dataclasses.replace(dm.augment, flip="alternate")
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 3 and torch.equal(dm.train_set.targets[batch[2]], batch[1])
    x, y = dm.transform_batch(batch, train=True, epoch=1)
    assert x.dtype == torch.float32 and torch.equal(y, batch[1])


def test_lookahead_pulls_the_weights_back_on_schedule_and_ends_on_the_average():
    from project.callbacks import Lookahead

    model = ImageClassifier(SimpleCNN(num_classes=3, width=4, hidden=8), num_classes=3, input_shape=None)
    callback = Lookahead(every_n_steps=2, decay=0.5, power=1.0)

    class Trainer:
        global_step, estimated_stepping_batches, max_steps = 0, 4, -1

    callback.on_fit_start(Trainer, model)
    callback.on_train_start(Trainer, model)
    weight = model.net.features[0].weight
    start = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)  # the optimizer moved it
    Trainer.global_step = 1
    callback.on_train_batch_end(Trainer, model)  # not an update step
    assert torch.allclose(weight, start + 1)
    Trainer.global_step = 2  # decay 0.5 x (2 / 4): the average moves 3/4 of the way
    callback.on_train_batch_end(Trainer, model)
    assert torch.allclose(weight, start + 0.75) and torch.allclose(
        callback.average["net.features.0.weight"], weight
    )
    with torch.no_grad():
        weight.add_(1.0)
    Trainer.global_step = 4  # the last step: the weights become the average, which moves no further
    callback.on_train_batch_end(Trainer, model)
    assert torch.allclose(weight, start + 0.75)
    restored = Lookahead()
    restored.load_state_dict(callback.state_dict())
    assert torch.equal(restored.average["net.features.0.weight"], weight)
