"""The rows of the quantization report before they are measured: what runs each variant, its size and its file."""

import io
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from project.atomic_files import file_size_mb
from project.export.runtimes import AotiRuntime, OnnxRuntime, Runtime, TorchRuntime


@dataclass
class Variant:
    """One row of the report before it is measured.

    Args:
        name: The row's label, e.g. `static INT8, calibrated on 16 training batches`.
        key: A short name for W&B, e.g. `int8_static`.
        runtime: What runs it (float32 batch in, the exported outputs out: logits, or tag probabilities).
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


def aoti_variant(path: Path, threads: int | None) -> Variant:
    """The FP32 AOTInductor package, compiled for the CPU (what `export --format aoti` writes)."""
    runtime = AotiRuntime(path, "cpu", threads)
    return Variant(
        "FP32 AOTInductor package", "fp32_aoti", runtime, file_size_mb(path), path.name, "AOTInductor (CPU)"
    )
