"""ProgressivePruning: the schedule, global and channel pruning in training, checkpoints, resuming."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from project.compression.pruning import ProgressivePruning
from project.errors import UserError
from project.run.checkpoints import load_checkpoint, load_weights
from tests.callback_fit import epoch_values, make_data, make_model, make_trainer, read_metrics


def schedule(max_epochs: int, **kwargs) -> ProgressivePruning:
    callback = ProgressivePruning(**kwargs)
    callback._range = callback._epochs(SimpleNamespace(max_epochs=max_epochs))
    return callback


def test_cubic_schedule_prunes_early_and_ends_at_target():
    callback = schedule(40, target_sparsity=0.8, start_epoch=2, end_epoch=-10)  # epochs 2..30
    values = [callback.sparsity_at(e) for e in range(40)]
    assert values[:2] == [None, None]
    steps = values[2:31]
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))  # rises every epoch
    assert values[30] == pytest.approx(0.8) and values[39] == pytest.approx(0.8)
    assert values[2 + 14] > 0.8 * 0.85  # cubic: ~7/8 of the way at half the schedule
    linear = schedule(40, target_sparsity=0.8, start_epoch=2, end_epoch=-10, schedule="linear")
    assert linear.sparsity_at(16) == pytest.approx(0.8 * 15 / 29)


def test_short_runs_compress_the_schedule_and_bad_values_are_named():
    assert schedule(1, start_epoch=2, end_epoch=-10)._range == (0, 0)  # a debug run still prunes
    with pytest.raises(UserError, match="target_sparsity"):
        ProgressivePruning(target_sparsity=1.5)
    with pytest.raises(UserError, match="end_epoch"):
        schedule(10, start_epoch=5, end_epoch=3)
    with pytest.raises(UserError, match="max_epochs"):
        schedule(-1, end_epoch=-3)


def zeros(state_dict: dict) -> float:
    weights = [v for k, v in state_dict.items() if k.endswith("weight") and v.ndim > 1]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


def test_global_pruning_reaches_target_and_checkpoint_loads_into_a_fresh_model(fake_cifar, tmp_path):
    pruning = ProgressivePruning(target_sparsity=0.6, start_epoch=0, end_epoch=2)
    model, data = make_model(), make_data(fake_cifar)
    make_trainer(tmp_path, [pruning], max_epochs=4).fit(model, data)

    sparsity = epoch_values(read_metrics(tmp_path), "sparsity/global")
    assert list(sparsity) == [0, 1, 2, 3]
    assert sparsity[0] < sparsity[1] < sparsity[2]  # gradually, not one cut
    assert sparsity[2] == pytest.approx(0.6, abs=0.01) and sparsity[3] == pytest.approx(0.6, abs=0.01)
    per_layer = epoch_values(read_metrics(tmp_path), "sparsity/net.features.3.weight")
    assert 0 < per_layer[3] < 1

    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    state = checkpoint["state_dict"]
    assert not any(k.endswith(("_orig", "_mask")) for k in state)  # plain weights
    assert zeros(state) == pytest.approx(0.6, abs=0.01)  # kept through the fine-tuning epoch

    fresh = make_model()  # an unpruned network
    load_weights(fresh, state)
    x, _ = data.transform_batch(next(iter(data.val_dataloader())), train=False)
    model.eval(), fresh.eval()
    with torch.no_grad():
        logits = fresh(x)
        assert torch.isfinite(logits).all() and logits.shape == (len(x), 10)
        assert torch.equal(logits.argmax(1), model(x).argmax(1))


def test_channel_pruning_zeroes_whole_output_channels(fake_cifar, tmp_path):
    pruning = ProgressivePruning(target_sparsity=0.5, start_epoch=0, end_epoch=1, structured=True, norm=2)
    model = make_model(width=16)
    make_trainer(tmp_path, [pruning], max_epochs=2).fit(model, make_data(fake_cifar))
    layers = [m for m in model.net.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    for layer in layers[:-1]:
        dead = (layer.weight.flatten(1) == 0).all(dim=1)
        assert dead.float().mean().item() == pytest.approx(0.5, abs=0.07), layer
    assert (layers[-1].weight != 0).all()  # the logits layer keeps every class


def test_resuming_mid_schedule_continues_from_the_saved_mask(fake_cifar, tmp_path):
    def callbacks():
        return [ProgressivePruning(target_sparsity=0.7, start_epoch=0, end_epoch=3)]

    data = make_data(fake_cifar)
    make_trainer(tmp_path / "a", callbacks(), max_epochs=2).fit(make_model(), data)
    saved = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt")["state_dict"]
    pruned_before = {k: v == 0 for k, v in saved.items() if k.endswith("weight") and v.ndim > 1}

    model = make_model()
    trainer = make_trainer(tmp_path / "b", callbacks(), max_epochs=5)
    trainer.fit(model, data, ckpt_path=tmp_path / "a" / "checkpoints" / "last.ckpt")
    final = model.state_dict()
    assert zeros(final) == pytest.approx(0.7, abs=0.01)
    for key, was_zero in pruned_before.items():  # pruned weights stayed pruned through the resume
        assert (final[key][was_zero] == 0).all(), key
