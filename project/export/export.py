"""`python -m project export`: a checkpoint to ONNX and/or TorchScript, verified, with its preprocessing JSON."""

import json
from pathlib import Path
from typing import Any, Literal

import torch

from project.export.files import staged_outputs
from project.export.onnx_export import DEFAULT_OPSET, INPUT_NAME, OUTPUT_NAME, export_onnx, verify_onnx
from project.export.tool_args import parse_tool_args
from project.export.torchscript_export import export_torchscript, verify_torchscript
from project.export.trained import TrainedModel, load_trained

FILES = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt"}


def export_trained(
    trained: TrainedModel,
    output_dir: str | Path,
    formats: tuple[str, ...] = ("onnx", "torchscript"),
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
) -> dict[str, Any]:
    """Write each format and `model.json` into `output_dir`, all or nothing; returns the JSON's content."""
    net, pre = trained.net.eval(), trained.preprocessing
    meta: dict[str, Any] = {
        "preprocessing": pre.to_dict(),
        "input": {
            "name": INPUT_NAME,
            "shape": ["batch", *pre.input_shape],
            "dtype": "float32",
            "layout": "NCHW, RGB",
            "steps": (
                "decode as RGB; resize the shorter side to input_shape[1] (bilinear); centre-crop to "
                "input_shape[1] x input_shape[2]; scale to [0, 1]; subtract mean and divide by std per channel"
            ),
        },
        "output": {
            "name": OUTPUT_NAME,
            "shape": ["batch", pre.num_classes],
            "meaning": "logits; softmax gives probabilities",
        },
        "source": {
            "checkpoint": str(trained.ckpt_path),
            "network": type(net).__name__,
            "torch": torch.__version__,
        },
        "files": {},
    }
    with staged_outputs(output_dir) as staging:
        if "onnx" in formats:
            export_onnx(net, pre.input_shape, staging / FILES["onnx"], opset=opset)
            diff = verify_onnx(net, staging / FILES["onnx"], pre.input_shape, atol=atol)
            meta["files"]["onnx"] = {"path": FILES["onnx"], "opset": opset, "max_abs_diff_vs_eager": diff}
        if "torchscript" in formats:
            method = export_torchscript(net, pre.input_shape, staging / FILES["torchscript"])
            diff = verify_torchscript(net, staging / FILES["torchscript"], pre.input_shape, atol=atol)
            meta["files"]["torchscript"] = {
                "path": FILES["torchscript"],
                "method": method,
                "max_abs_diff_vs_eager": diff,
            }
        (staging / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def export(
    ckpt_path: str,
    config: list[str] | None = None,
    format: Literal["onnx", "torchscript", "all"] = "all",
    output_dir: str = "export",
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Export a trained checkpoint to ONNX and/or TorchScript, verified against the eager model.

    The ONNX file has a dynamic batch axis; right after writing it is checked with onnx.checker and run
    in ONNX Runtime on random batches of two sizes against the eager network. TorchScript is made with
    torch.jit.script, falling back to torch.jit.trace with a warning. model.json beside the models holds
    the input size, mean/std and class names, so a consumer needs nothing else. Files are written to a
    staging folder and moved into place only when every check passed: a failed export leaves no file.

    Args:
        ckpt_path: Checkpoint written by `python -m project fit`.
        config: Config file(s) of the training run.
        format: `onnx`, `torchscript` or `all`.
        output_dir: Folder for model.onnx, model.torchscript.pt and model.json (created if missing).
        opset: ONNX opset version to write.
        atol: Largest accepted absolute difference between exported and eager logits; above it the
            export fails and writes nothing.
        overrides: --model.* / --data.* flags for the config parser.
    """
    trained = load_trained(ckpt_path, config, overrides)
    formats = ("onnx", "torchscript") if format == "all" else (format,)
    meta = export_trained(trained, output_dir, formats, opset=opset, atol=atol)
    for fmt, info in meta["files"].items():
        print(f"{fmt}: {Path(output_dir) / info['path']}")
    print(f"preprocessing: {Path(output_dir) / 'model.json'}")
    return meta


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `export` for a command line (checks it without running anything)."""
    return parse_tool_args(export, args, prog="python -m project export")


def main(args: list[str]) -> None:
    export(**parse_args(args))
