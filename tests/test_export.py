"""`python -m project export`: ONNX and TorchScript files that match eager, their JSON, atomic failure."""

import json

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from project.errors import UserError
from project.export.model_export import DEFAULT_OPSET, export, export_torchscript
from project.export.preprocessing import read_metadata
from project.export.trained import load_trained
from project.run.checkpoints import load_checkpoint
from tests.conftest import run_cli

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported


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
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.onnx", "model.torchscript.pt"]
    assert "batch 1: max |onnxruntime - eager|" in proc.stdout and "batch 5" in proc.stdout

    # The JSON carries the checkpoint's preprocessing facts.
    meta, pre = read_metadata(out / "model.onnx")
    state = load_checkpoint(trained_run.ckpt)["CIFARDataModule"]
    assert list(pre.class_names) == state["class_names"] and list(pre.mean) == pytest.approx(state["mean"])
    assert pre.input_shape == (3, 32, 32) and meta["files"]["onnx"]["opset"] == DEFAULT_OPSET
    assert meta["files"]["torchscript"]["method"] == "script"

    # A dynamic batch axis, the stated opset, and outputs equal to the eager network's at other batch sizes.
    model = onnx.load(out / "model.onnx")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert {o.domain: o.version for o in model.opset_import}[""] == DEFAULT_OPSET
    import onnxruntime as ort

    net = load_trained(trained_run.ckpt).net
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    for batch_size in (3, 17):
        x = torch.randn(batch_size, 3, 32, 32)
        with torch.no_grad():
            expected = net(x).numpy()
            np.testing.assert_allclose(scripted(x).numpy(), expected, atol=1e-5)
        np.testing.assert_allclose(session.run(None, {"input": x.numpy()})[0], expected, atol=1e-4)


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
