import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.models import SimpleCNN
from project.tasks import ImageClassifier


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, weight_decay=1e-4)


def quiet_trainer(tmp_path, **kwargs) -> L.Trainer:
    return L.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        **kwargs,
    )


def test_step_metrics_and_predict():
    model = ImageClassifier(
        SimpleCNN(num_classes=3), num_classes=3, class_names=["a", "b", "c"], optimizer=sgd
    )
    assert model.example_input_array.shape == (2, 3, 32, 32)
    x, y = torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1, 2])
    loss, logits = model._shared_step((x, y), model.val_metrics, model.val_loss)
    assert logits.shape == (6, 3)
    assert loss.ndim == 0 and torch.isfinite(loss)
    metrics = model.val_metrics.compute()
    assert set(metrics) == {"val/acc", "val/acc_top3"} and 0 <= metrics["val/acc"] <= 1
    assert metrics["val/acc_top3"] == 1.0  # top-3 of 3 classes is always right
    out = model.predict_step((x, torch.arange(6)), 0)
    assert out["pred"].shape == (6,) and torch.all((out["prob"] > 1 / 3 - 1e-6) & (out["prob"] <= 1))
    assert torch.equal(out["index"], torch.arange(6))


def test_accuracy_is_per_image_and_top_k_never_merges_with_top_1():
    """A class-sorted validation split starts with batches of one class. Seen by a fresh network that never
    ranks that class in its top 5, top-1 and top-5 have identical states after the first update: torchmetrics'
    compute groups would then merge them for the rest of the run. And accuracy counts images, not classes."""
    model = ImageClassifier(SimpleCNN(num_classes=10), num_classes=10)
    first = torch.full((4, 10), -1.0)
    first[:, 9] = 5.0  # predicts class 9; the true class 0 ranks last
    metrics = model.val_metrics
    metrics.update(first, torch.zeros(4, dtype=torch.long))
    second = torch.arange(10.0).repeat(4, 1)  # ranks 9, 8, 7, 6, 5 first
    metrics.update(second, torch.tensor([9, 5, 5, 1]))  # top-1 right once, top-5 right 3 times
    result = {k: round(v.item(), 4) for k, v in metrics.compute().items()}
    assert result == {"val/acc": 1 / 8, "val/acc_top5": 3 / 8}


def test_no_weight_decay_on_norm_and_bias():
    model = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, optimizer=sgd)
    opt = model.configure_optimizers()
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])


@pytest.mark.slow
def test_one_cycle_gets_total_steps_and_steps_per_batch(tmp_path):
    from functools import partial

    factory = partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.5, total_steps=None)
    model = ImageClassifier(
        SimpleCNN(num_classes=2), num_classes=2, input_shape=None, optimizer=sgd, scheduler=factory
    )
    data = TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 2, (64,)))
    trainer = quiet_trainer(tmp_path, max_epochs=30)
    trainer.fit(model, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
    config = trainer.lr_scheduler_configs[0]
    assert config.interval == "step"
    assert config.scheduler.total_steps == 120  # 30 epochs x 4 batches
    assert config.scheduler.last_epoch == 120  # stepped once per batch


def test_load_from_checkpoint_without_a_trainer(tmp_path):
    """The notebooks' way back from a checkpoint: `load_from_checkpoint` calls `configure_model` with no
    trainer attached, which must not need one outside FSDP2."""
    model = ImageClassifier(SimpleCNN(num_classes=2), num_classes=2, input_shape=None, optimizer=sgd)
    data = TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 2, (8,)))
    trainer = quiet_trainer(tmp_path, max_steps=1)
    trainer.fit(model, DataLoader(data, batch_size=8))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    restored = ImageClassifier.load_from_checkpoint(
        tmp_path / "model.ckpt", net=SimpleCNN(num_classes=2), weights_only=True
    )
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(restored.eval()(x), model.eval()(x))


def test_a_checkpoint_records_what_the_task_monitors_and_what_its_outputs_mean():
    model = ImageClassifier(SimpleCNN(num_classes=3), num_classes=3, class_names=["a", "b", "c"])
    checkpoint: dict = {}
    model.on_save_checkpoint(checkpoint)
    assert checkpoint["task"] == {
        "task": "ImageClassifier",
        "names": ["a", "b", "c"],
        "outputs": "logits",
        "decode": "softmax, then the most probable class",
    }
    assert checkpoint["monitor_best"] == {"monitor": "val/acc", "value": None}
    assert (ImageClassifier.monitor, ImageClassifier.monitor_mode) == ("val/acc", "max")
