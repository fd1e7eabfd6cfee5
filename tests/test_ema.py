"""EMA of the weights (configs/callbacks/ema.yaml, Lightning's EMAWeightAveraging): validation, the best checkpoint,
test and the tools that read a checkpoint's `state_dict` (export, quantize, serve) use the average, and a run
stopped and resumed with `--ckpt_path last` ends with the very average (and trained weights) of a run never
stopped."""

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging

from project.cli import main
from tests import docs_pages
from tests.callback_fit import make_data, make_model, make_trainer
from tests.conftest import CONFIGS
from tests.test_exact_resume import assert_same_weights, fit_args, stop_and_resume
from tests.tiny_fit import command_args

EMA = ["--config", str(CONFIGS / "callbacks" / "ema.yaml")]


def evaluate(weights: dict[str, torch.Tensor], data_dir: Path, root: Path) -> dict[str, float]:
    """val/ and test/ metrics of a fresh model holding `weights`."""
    model = make_model()
    model.load_state_dict(weights)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=root)
    data = make_data(data_dir)
    return {
        **{k: float(v) for k, v in trainer.validate(model, data, verbose=False)[0].items()},
        **{k: float(v) for k, v in trainer.test(model, data, verbose=False)[0].items()},
    }


def test_validation_checkpoints_and_test_use_the_averaged_weights(fake_cifar, tmp_path):
    ema = EMAWeightAveraging(decay=0.9)
    model = make_model()
    trainer = make_trainer(tmp_path, [ema], max_epochs=2)
    data = make_data(fake_cifar)
    trainer.fit(model, data)
    logged_val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    test = trainer.test(model, data, verbose=False)[0]  # after fit, in the same process

    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    averaged, trained = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert checkpoint["averaging_state"]["n_averaged"] == trainer.global_step  # one update per step
    assert not all(torch.equal(averaged[k], trained[k]) for k in averaged)
    with_average = evaluate(averaged, fake_cifar, tmp_path)
    with_trained = evaluate(trained, fake_cifar, tmp_path)
    # The last validation of the fit measured the average, not the trained weights.
    assert logged_val["val/loss"] == with_average["val/loss"] != with_trained["val/loss"]
    assert logged_val["val/acc"] == with_average["val/acc"]
    # fit leaves the average in the model: test measures it too.
    assert test["test/loss"] == with_average["test/loss"] != with_trained["test/loss"]
    assert all(torch.equal(v, averaged[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_resume_restores_the_average_exactly_and_export_reads_it(fake_cifar, tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    # Stopped mid-epoch (step 21 of 48) by SIGTERM, then resumed: the same weights and average as never stopped.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(fit_args(fake_cifar, whole, *EMA, stop=10**6))
    assert not [w for w in caught if "WeightAveraging" in str(w.message)]  # nothing to heed
    stop_and_resume(fit_args(fake_cifar, stopped, *EMA))
    (whole_last,) = whole.glob("runs/version_*/checkpoints/last.ckpt")
    (stopped_last,) = stopped.glob("runs/version_*/checkpoints/last.ckpt")
    a, b = (torch.load(p, weights_only=True) for p in (whole_last, stopped_last))
    assert a["averaging_state"]["n_averaged"] == a["global_step"] == 48
    assert_same_weights(b["state_dict"], a["state_dict"])  # the average
    assert_same_weights(b["current_model_state"], a["current_model_state"])  # the trained weights
    assert b["averaging_state"] == a["averaging_state"]

    # The best checkpoint holds the average in `state_dict`, which export, quantize and serve load.
    (best,) = whole.glob("runs/version_*/checkpoints/epoch*.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    averaged, trained = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert not all(torch.equal(v, trained[k]) for k, v in averaged.items())
    # part: production
    from project.export.trained import load_trained

    net = load_trained(best).net.state_dict()
    assert all(torch.equal(v, averaged[f"net.{k}"]) for k, v in net.items())
    assert not all(torch.equal(v, trained[f"net.{k}"]) for k, v in net.items())
    # /part: production

    # validate/test/predict from it: the average is in state_dict; there is nothing to average, nor to warn of.
    args = fit_args(fake_cifar, whole, *EMA)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["validate", *args[1:], "--ckpt_path", str(best)])
    assert not [w for w in caught if "WeightAveraging" in str(w.message)]


def test_ema_with_sharded_weights_is_refused_in_one_line(fake_cifar, tmp_path, capsys):
    args = fit_args(fake_cifar, tmp_path, "--config", CONFIGS / "trainer" / "fsdp2_cpu.yaml", *EMA)
    with pytest.raises(SystemExit):
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: EMAWeightAveraging keeps a whole copy of the network in every process")


def ema_commands() -> list[str]:
    """The `python -m project` lines naming configs/callbacks/ema.yaml in the pages and in the preset itself."""
    texts = [docs_pages.text(), (CONFIGS / "callbacks" / "ema.yaml").read_text()]
    lines = [line.lstrip("# ").split("  #")[0].strip() for text in texts for line in text.splitlines()]
    return sorted({line for line in lines if line.startswith("python -m project ") and "ema.yaml" in line})


@pytest.mark.parametrize("command", ema_commands())
@pytest.mark.slow
def test_the_documented_ema_commands_train_with_an_average(command, image_folder, tmp_path):
    args = command_args(command.replace("path/to/images", str(image_folder)))
    main([
        *args, "--data.image_size", "16", "--data.batch_size", "8", "--data.cache_dir", str(tmp_path / "cache"),
        "--data.skip_corrupt", "true",  # the fixture holds a broken file
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "runs"),
    ])  # fmt: skip
    (ckpt,) = (tmp_path / "runs").glob("runs/version_*/checkpoints/last.ckpt")
    checkpoint = torch.load(ckpt, weights_only=True)
    assert checkpoint["averaging_state"]["n_averaged"] == checkpoint["global_step"] == 3
