"""`python -m project export`: ONNX, AOTInductor and TorchScript files that match eager, their JSON, atomic
failure (a bad tolerance, a network that cannot be captured, no compiler, a full disk, Ctrl-C)."""

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from project.cli import main
from project.errors import UserError
from project.export.aoti import MAX_BATCH, is_aoti_package, load_aoti
from project.export.model_export import DEFAULT_OPSET, export, export_torchscript, export_trained
from project.export.preprocessing import Preprocessing, read_metadata
from project.export.trained import TrainedModel, load_trained
from project.models import MLP
from project.run.checkpoints import load_checkpoint
from tests.conftest import PACKAGE, ROOT, run_cli, subprocess_env

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported, exported_aoti


@pytest.mark.slow  # compiles an AOTInductor package
def test_export_all_formats(trained_run, tmp_path):
    out = tmp_path / "export"
    proc = run_cli(
        "export",
        "--ckpt_path",
        trained_run.ckpt,
        "--config",
        trained_run.config,
        "--output_dir",
        out,
        cwd=tmp_path,
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "model.json",
        "model.onnx",
        "model.pt2",
        "model.torchscript.pt",
    ]
    assert "batch 1: max |onnxruntime - eager|" in proc.stdout and "batch 5" in proc.stdout
    assert "aoti: batch 1: max |aoti - eager|" in proc.stdout and "aoti: batch 5" in proc.stdout
    assert proc.stderr.strip() == ""  # no compiler or exporter notes

    # The JSON carries the checkpoint's preprocessing facts.
    meta, pre = read_metadata(out / "model.onnx")
    state = load_checkpoint(trained_run.ckpt)["CIFARDataModule"]
    assert list(pre.class_names) == state["class_names"] and list(pre.mean) == pytest.approx(state["mean"])
    assert pre.input_shape == (3, 32, 32) and meta["files"]["onnx"]["opset"] == DEFAULT_OPSET
    assert meta["files"]["torchscript"]["method"] == "script"
    assert meta["files"]["aoti"]["device"] == "cpu" and meta["files"]["aoti"]["batch"] == [1, MAX_BATCH]

    # A dynamic batch axis, the stated opset, and outputs equal to the eager network's at other batch sizes.
    model = onnx.load(out / "model.onnx")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert {o.domain: o.version for o in model.opset_import}[""] == DEFAULT_OPSET
    import onnxruntime as ort

    net = load_trained(trained_run.ckpt).net
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    package = torch._inductor.aoti_load_package(str(out / "model.pt2"))
    for batch_size in (3, 17):
        x = torch.randn(batch_size, 3, 32, 32)
        with torch.no_grad():
            expected = net(x).numpy()
            np.testing.assert_allclose(scripted(x).numpy(), expected, atol=1e-5)
            np.testing.assert_allclose(package(x).numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(session.run(None, {"input": x.numpy()})[0], expected, atol=1e-4)


@pytest.mark.slow
def test_failed_export_writes_nothing(trained_run, tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(UserError, match=r"differs from eager by up to .* above the tolerance --atol 1e-12"):
        export(str(trained_run.ckpt), format="all", output_dir=str(out), atol=1e-12)
    assert not out.exists()  # neither the files nor the folder this call created

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(UserError):
        export(str(trained_run.ckpt), format="onnx", output_dir=str(existing), atol=1e-12)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]  # no staging folder, no partial model
    with pytest.raises(UserError, match=r"The AOTInductor package output differs from eager by up to "):
        export(str(trained_run.ckpt), format="aoti", output_dir=str(existing), atol=1e-12)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]


def test_bad_input_is_one_clear_error(trained_run, tmp_path):
    proc = run_cli(
        "export",
        "--ckpt_path",
        tmp_path / "missing.ckpt",
        "--config",
        trained_run.config,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1]
        == f"error: checkpoint {tmp_path / 'missing.ckpt'} does not exist"
    )

    lone = tmp_path / "lone.ckpt"
    lone.write_bytes(trained_run.ckpt.read_bytes())  # no config.yaml beside its run
    with pytest.raises(UserError, match="no --config given and no config.yaml"):
        export(str(lone), output_dir=str(tmp_path / "x"))


class _VarArgsNet(nn.Module):
    """TorchScript cannot compile *args in forward; a trace can record it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * 4 * 4, 2)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs[0].flatten(1))


def test_torchscript_falls_back_to_trace_with_a_reason(tmp_path):
    net = _VarArgsNet().eval()
    with pytest.warns(
        UserWarning, match=r"torch\.jit\.script failed \(.+\); falling back to torch\.jit\.trace"
    ):
        method = export_torchscript(net, (3, 4, 4), tmp_path / "m.pt")
    assert method == "trace"
    x = torch.randn(5, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "m.pt"))(x), net(x))


@pytest.mark.slow
def test_the_aoti_package_runs_any_batch_as_eager_does_and_model_json_records_it(exported_aoti, trained_run):
    meta, pre = read_metadata(exported_aoti)
    assert set(meta["files"]) == {"aoti"} and meta["files"]["aoti"]["path"] == "model.pt2"
    assert meta["files"]["aoti"]["device"] == "cpu" and meta["files"]["aoti"]["max_abs_diff_vs_eager"] < 1e-4
    assert meta["files"]["aoti"]["compiled_for"].startswith(f"{platform.machine()} CPU with ")  # e.g. avx2
    assert pre.input_shape == (3, 32, 32) and meta["source"]["network"] == "SimpleCNN"
    assert is_aoti_package(exported_aoti) and not is_aoti_package(exported_aoti.with_name("model.json"))
    package, net = load_aoti(exported_aoti), load_trained(trained_run.ckpt).net.eval()
    for batch_size in (1, 2, 64):  # the export's example had 2: a static batch would refuse the others
        x = torch.randn(batch_size, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(package(x), net(x), atol=1e-5, rtol=1e-5)


class _Branchy(nn.Module):
    """Python control flow on a tensor's value: torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.linear(x) if x.sum() > 0 else -self.linear(x)


def _tiny(net: nn.Module, shape: tuple[int, int, int] = (3, 4, 4)) -> TrainedModel:
    pre = Preprocessing(shape, (0.5,) * 3, (0.5,) * 3, ("a", "b"))
    return TrainedModel(net.eval(), pre, None, Path("x.ckpt"), None)  # type: ignore[arg-type]


def test_an_aoti_export_that_cannot_be_made_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"torch\.export cannot capture the network _Branchy .*--format onnx"):
        export_trained(_tiny(_Branchy()), out, formats=("aoti",))
    assert not out.exists() and "def forward" not in capsys.readouterr().err  # no partial graph printed

    import torch._inductor.config as inductor_config  # a submodule: `import torch` leaves it out

    # Inductor's own patch, not monkeypatch: undoing a monkeypatch of a value the config module holds as a
    # default deletes the setting from the module, and every later compile in the process fails on it.
    no_compiler = {
        "cpp.cxx": ("/nonexistent/c++",),
        "force_disable_caches": True,
    }  # (no earlier compiled graph)
    net = MLP(num_classes=2, input_shape=(3, 7, 7), hidden=3)
    with (
        inductor_config.patch(no_compiler),
        pytest.raises(UserError, match=r"AOTInductor could not compile .*C\+\+ compiler.*--format onnx"),
    ):
        export_trained(_tiny(net, (3, 7, 7)), out, formats=("onnx", "aoti"))
    assert inductor_config.force_disable_caches is False  # the setting is back, not gone
    assert not out.exists()  # the ONNX file, written and verified first, went too


def test_exported_fixture_matches_json(exported):
    meta = json.loads(exported.with_name("model.json").read_text())
    assert set(meta["files"]) == {"onnx"} and meta["files"]["onnx"]["max_abs_diff_vs_eager"] < 1e-4


def test_model_json_says_what_the_outputs_mean_as_the_task_recorded_it(tmp_path):
    """The task records what its outputs mean in every checkpoint; the export's JSON carries it."""
    from project.export.model_export import export_trained
    from project.export.preprocessing import Preprocessing
    from project.export.trained import TrainedModel
    from project.models import MLP

    pre = Preprocessing((3, 8, 8), (0.5,) * 3, (0.5,) * 3, ("a", "b"))
    outputs = {
        "task": "ImageClassifier",
        "names": ["a", "b"],
        "outputs": "logits",
        "decode": "softmax, then the top class",
    }
    trained = TrainedModel(
        MLP(num_classes=2, input_shape=(3, 8, 8), hidden=4).eval(), pre, None, tmp_path / "x.ckpt", outputs
    )  # type: ignore[arg-type]
    meta = export_trained(trained, tmp_path / "out", formats=("torchscript",))
    assert meta["task"] == outputs and meta["output"]["meaning"] == "logits; softmax, then the top class"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("fmt", ["onnx", pytest.param("aoti", marks=pytest.mark.slow), "torchscript"])
def test_a_full_disk_is_one_line_and_leaves_nothing_there(trained_run, full_disk, fmt, capsys):
    out = full_disk / "export"
    with pytest.raises(SystemExit) as stop:
        main(["export", "--ckpt_path", str(trained_run.ckpt), "--format", fmt, "--output_dir", str(out)])
    assert stop.value.code == 1
    line = _one_error_line(capsys)
    assert line.startswith(f"error: no space left on the device to write {out}")
    assert line.endswith("nothing was written there. Free some space, or choose another --output_dir")
    assert list(full_disk.iterdir()) == []  # no folder, staging folder or partial file


@pytest.mark.slow
def test_ctrl_c_while_the_package_compiles_leaves_nothing_and_says_so(trained_run, tmp_path):
    out = tmp_path / "export"
    proc = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, "export", "--ckpt_path", str(trained_run.ckpt), "--format", "aoti",
         "--output_dir", str(out)],
        cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob(".staging-*")):  # the checkpoint is read: the package is being made
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group, the compiler too
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert err.strip().splitlines()[-1] == f"error: stopped by Ctrl-C; nothing was written to {out}"
    assert "Traceback" not in err and not out.exists()


@pytest.mark.slow
def test_the_deployment_benchmark_runs_on_a_tiny_setting():
    """benchmarks/deploy_latency.py end to end on the SimpleCNN alone, a few repeats (a check that it runs and
    reports every variant, not a measurement): one line per variant, one for the package, then the ratio."""
    args = ["--networks", "simplecnn", "--repeats", "2", "--warmup", "1", "--batch_size", "4", "--loads", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.deploy_latency", *args, "--threads", "1"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    header, *rows, package = map(json.loads, lines[:-1])
    assert header["benchmark"] == "deploy_latency" and header["batch_size"] == 4
    assert [r["variant"] for r in rows] == ["eager", "torch.compile", "onnxruntime", "aoti"]
    assert all(r["network"] == "simplecnn" and r["latency_ms"] > 0 and r["throughput"] > 0 for r in rows)
    assert package["network"] == "simplecnn" and package["input"] == [3, 32, 32]
    assert package["package_mb"] > 0 and package["load_ms"] > 0 and package["compile_s"] > 0
    throughput = {r["variant"]: r["throughput"] for r in rows}
    assert lines[-1].startswith("ratio: ")  # of the rounded figures above, to the rounding
    assert float(lines[-1].split()[1]) == pytest.approx(
        throughput["aoti"] / throughput["onnxruntime"], abs=0.02
    )
