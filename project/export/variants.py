"""The model variants a quantization report compares: each a runtime plus what the table says about it."""

import io
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from project.export.files import file_size_mb
from project.export.qat_artifact import load_int8_runtime
from project.export.runtimes import OnnxRuntime, Runtime, TorchRuntime


@dataclass
class Variant:
    """One row of the report before it is measured.

    Args:
        name: The row's label, e.g. `static INT8, calibrated on 16 training batches`.
        key: A short name for W&B, e.g. `int8_static`.
        runtime: What runs it (float32 batch in, logits out).
        size_mb: Size on disk of what a deployment ships.
        artifact: That file (or the checkpoint, for eager).
        runs_on: How it runs, e.g. `ONNX Runtime` or `torch.compile (freezing)`.
    """

    name: str
    key: str
    runtime: Runtime
    size_mb: float
    artifact: str
    runs_on: str


def eager_variant(net: nn.Module, ckpt_path: str | Path) -> Variant:
    """FP32 in PyTorch eager; its size is that of its saved weights (the checkpoint also holds optimizer state)."""
    buffer = io.BytesIO()
    torch.save(net.state_dict(), buffer)
    return Variant(
        "FP32 eager", "fp32_eager", TorchRuntime(net), buffer.tell() / 2**20, str(ckpt_path), "PyTorch eager"
    )


def onnx_variant(name: str, key: str, path: Path, threads: int | None) -> Variant:
    return Variant(name, key, OnnxRuntime(path, threads), file_size_mb(path), path.name, "ONNX Runtime")


def int8_variant(
    name: str, key: str, path: Path, input_shape: tuple[int, ...], threads: int | None, compile: bool = True
) -> Variant:
    """An INT8 `.pt2` program (PT2E static or QAT) or `.onnx` model; `.pt2` under torch.compile if it can."""
    runtime, runs_on = load_int8_runtime(path, input_shape, threads, compile=compile)
    return Variant(name, key, runtime, file_size_mb(path), str(path), runs_on)
