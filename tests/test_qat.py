"""Quantization-aware training: the PT2E helpers, the callback's checks, and a QAT fit (with pruning) whose INT8
model reloads in a fresh process and agrees with the fake-quantized model."""

import subprocess
import sys
import warnings

import lightning as L
import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock

from project.compression import int8_program, pt2e
from project.compression.pruning import ProgressivePruning
from project.compression.qat import QuantizationAwareTraining
from project.errors import UserError
from project.models import SimpleCNN
from project.run.checkpoints import load_checkpoint, load_weights
from tests.callback_fit import make_data, make_model, make_trainer
from tests.conftest import CONFIGS, ROOT, newest_run, run_cli
from tests.test_callback_configs import resolve


def tiny_resnet() -> nn.Module:
    # torchvision's BasicBlock calls one ReLU module twice, which the x86 quantizer rejects unless split.
    block = BasicBlock(8, 8)
    nn.init.zeros_(block.bn2.weight)  # zero_init_residual: QAT's conv+BN fold divides by it
    stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    return nn.Sequential(stem, block, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(8, 4))


def batchnorm_training_flags(graph) -> list[bool]:
    return [n.args[5] for n in graph.graph.nodes if n.target == torch.ops.aten.batch_norm.default]


@pytest.mark.slow
def test_prepare_train_freeze_convert_a_residual_block():
    torch.manual_seed(0)
    net = tiny_resnet()
    x, y = torch.randn(64, 3, 16, 16), torch.randint(0, 4, (64,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the maintained path: no deprecation warnings
        prepared = pt2e.prepare_qat(net, torch.zeros(2, 3, 16, 16))
    assert all(p1 is p2 for p1, p2 in zip(prepared.parameters(), net.parameters(), strict=False))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)  # built for the eager net: trains the graph
    for _ in range(10):
        loss = nn.functional.cross_entropy(prepared(x), y)
        optimizer.zero_grad(), loss.backward(), optimizer.step()
    assert torch.isfinite(loss)

    # .train()/.eval() switch the graph's BatchNorm and pause the observers in eval mode.
    prepared.eval()
    assert batchnorm_training_flags(prepared) == [False, False, False]
    scales = {k: v.clone() for k, v in prepared.state_dict().items() if k.endswith(".scale")}
    prepared(x * 10)
    assert all(torch.equal(v, prepared.state_dict()[k]) for k, v in scales.items())
    prepared.train()
    assert batchnorm_training_flags(prepared) == [True, True, True]

    pt2e.freeze_batchnorm(prepared)  # BN uses (and keeps) its running statistics, in training too
    assert batchnorm_training_flags(prepared) == [False, False, False]
    running = net[0][1].running_mean.clone()
    prepared(x + 1)
    assert torch.equal(running, net[0][1].running_mean)
    pt2e.freeze_observers(prepared)

    prepared.eval()
    with torch.no_grad():
        fake_quant = prepared(x).argmax(1)
        int8 = pt2e.convert(prepared)
        assert (int8(x).argmax(1) == fake_quant).float().mean() >= 0.99
        assert (pt2e.without_fake_quant(prepared)(x).argmax(1) == fake_quant).float().mean() >= 0.9
    assert any(t.dtype == torch.int8 for t in int8.state_dict().values())
    assert not any(
        t.dtype == torch.float32 and t.ndim == 4 for t in int8.state_dict().values()
    )  # no float kernels


@pytest.mark.slow
def test_compiled_int8_agrees_with_the_int8_graph_at_any_batch_size():
    torch.manual_seed(0)
    net = SimpleCNN(width=8, hidden=16)
    prepared = pt2e.prepare_qat(net, torch.zeros(2, 3, 32, 32))
    prepared(torch.randn(32, 3, 32, 32))  # calibrates the observers
    int8 = pt2e.convert(prepared.eval())
    compiled = int8_program.compile_int8(
        int8
    )  # oneDNN INT8 kernels; compiles with the machine's C++ compiler
    for batch in (16, 5):  # the program has a dynamic batch dimension
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            assert (compiled(x).argmax(1) == int8(x).argmax(1)).float().mean() >= 0.99


def test_qat_refuses_mixed_precision_and_overlapping_pruning(fake_cifar, tmp_path):
    data = make_data(fake_cifar)
    trainer = make_trainer(tmp_path, [QuantizationAwareTraining(start_epoch=0)], precision="bf16-mixed")
    with pytest.raises(UserError, match="precision 32-true"):
        trainer.fit(make_model(), data)
    callbacks = [ProgressivePruning(start_epoch=0, end_epoch=2), QuantizationAwareTraining(start_epoch=1)]
    with pytest.raises(
        UserError, match="pruning ends at epoch 2 but quantization-aware training starts at epoch 1"
    ):
        make_trainer(tmp_path, callbacks, max_epochs=4).fit(make_model(), data)


def test_a_run_that_stops_before_qat_says_no_int8_model_was_saved(fake_cifar, tmp_path):
    trainer = make_trainer(tmp_path, [QuantizationAwareTraining(start_epoch=2)], max_epochs=3, max_steps=2)
    with pytest.warns(UserWarning, match="before QAT started .epoch 2.: no INT8 model was saved"):
        trainer.fit(make_model(), make_data(fake_cifar))
    assert not list(tmp_path.rglob("*.pt2"))


PREDICT_INT8 = """
import sys, torch
from project.compression import int8_program, pt2e
model, metadata = int8_program.load_int8(sys.argv[1])
batch = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(model(batch["x"]).argmax(1), sys.argv[3])
print(metadata["class_names"][0], metadata["input_shape"])
"""


@pytest.mark.slow
def test_qat_fit_with_pruning_saves_an_int8_model_that_reloads_in_a_fresh_process(fake_cifar, tmp_path):
    logs = tmp_path / "logs"
    result = run_cli(
        "fit", "--config", CONFIGS / "cifar10.yaml",
        "--config", CONFIGS / "callbacks" / "pruning.yaml", "--config", CONFIGS / "callbacks" / "qat.yaml",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "8", "--model.net.init_args.hidden", "32",
        "--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", "0.003", "--model.scheduler", "null",
        "--data.data_dir", fake_cifar, "--data.download", "false", "--data.val_size", "100",
        "--data.batch_size", "50", "--trainer.max_epochs", "3", "--trainer.default_root_dir", logs,
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        cwd=tmp_path,
        timeout=900,  # minutes on a loaded 2-core machine
    )  # fmt: skip
    # With 3 epochs the stacked schedules compress: prune to 50% at epoch 0, QAT from epoch 0 (after the
    # pruning), BN frozen from the start, ranges frozen from epoch 1.
    assert "pruning made permanent" in result.stderr + result.stdout
    assert "deprecat" not in result.stderr.lower()
    folder = newest_run(logs) / "checkpoints"
    assert (folder / "model_int8.pt2").is_file()
    report = {k: float(v) for k, v in read_metrics_from_stdout(result.stdout + result.stderr).items()}
    assert report["INT8"] >= 0.1 and abs(report["INT8"] - report["fake-quantized"]) <= 0.05

    # The QAT checkpoint loads into a fresh float model, with the sparsity kept through QAT.
    state = load_checkpoint(folder / "last.ckpt")["state_dict"]
    load_weights(make_model(), state)
    weights = [v for k, v in state.items() if k.endswith("weight") and v.ndim > 1]
    assert sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights) == pytest.approx(
        0.5, abs=0.01
    )

    # With the callback, `validate` from that checkpoint restores the fake-quantized model.
    model, data = make_model(), make_data(fake_cifar)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[QuantizationAwareTraining()]
    )
    trainer.validate(model, data, ckpt_path=folder / "last.ckpt", verbose=False)
    assert isinstance(model.net, torch.fx.GraphModule)
    x, _ = data.transform_batch(next(iter(data.val_dataloader())), train=False)
    with torch.no_grad():
        fake_quant = model.eval()(x).argmax(1)
    torch.save({"x": x}, tmp_path / "batch.pt")

    out = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning:torch", "-c", PREDICT_INT8, folder / "model_int8.pt2", tmp_path / "batch.pt", tmp_path / "int8.pt"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    assert out.stdout.split() == ["airplane", "[3,", "32,", "32]"]
    int8 = torch.load(tmp_path / "int8.pt")
    assert (int8 == fake_quant).float().mean() >= 0.99


def read_metrics_from_stdout(text: str) -> dict[str, str]:
    """{'float': ..., 'fake-quantized': ..., 'INT8': ...} from the callback's report line."""
    line = next(line for line in text.splitlines() if "validation accuracy" in line)
    parts = line.split("validation accuracy", 1)[1].split("(")[0].split("|")
    return dict(part.strip().rsplit(" ", 1) for part in parts)


def test_pruning_qat_and_diagnostics_stack_together(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    names = ["pruning.yaml", "qat.yaml", "diagnostics.yaml", "speed.yaml"]
    resolved = resolve(capsys, *(CONFIGS / "callbacks" / n for n in names))
    got = [c["class_path"].rsplit(".", 1)[-1] for c in resolved["trainer"]["callbacks"]]
    assert got == [
        "ProgressivePruning",
        "QuantizationAwareTraining",
        "UpdateRatioMonitor",
        "ImageThroughputMonitor",
    ]
    assert resolved["trainer"]["precision"] == "32-true"  # from qat.yaml, over the recipe's 16-mixed
    # part: dashboards
    assert resolved["wandb_dashboard"]["init_args"]["watch"] is None
    # /part: dashboards
    assert resolved["data_wait"]["init_args"]["synchronize"] is True
