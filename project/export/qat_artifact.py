"""Finding and running the INT8 model saved by quantization-aware training, for the quantization report.

A QAT run saves its converted INT8 model next to the checkpoints, as a `torch.export` program (`.pt2`)
or an ONNX file. Either runs here under the same calling convention as the other variants.
"""

from pathlib import Path

from project.errors import UserError
from project.export.runtimes import OnnxRuntime, Runtime, TorchRuntime

#: File names a QAT artifact is recognised by, in the checkpoint's folder.
#: `model_int8.pt2` is the default name used by `project.callbacks.QuantizationAwareTraining`.
QAT_PATTERNS = ("*qat*.pt2", "*qat*.onnx", "*int8*.pt2")


def find_qat_artifact(ckpt_path: str | Path) -> Path | None:
    """The newest QAT INT8 artifact in the checkpoint's folder, or None."""
    folder = Path(ckpt_path).parent
    found = {p for pattern in QAT_PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def load_qat_runtime(path: str | Path, threads: int | None = None, compile: bool = True) -> Runtime:
    """A runtime for a `.onnx` (ONNX Runtime) or `.pt2` (`torch.export` program of the QAT callback) INT8 model.

    A PT2E INT8 program runs its quantize/dequantize pairs around float kernels unless `torch.compile`
    lowers them to INT8 kernels (building C++ on first use, which takes a while): `compile` measures the
    deployed form.
    """
    path = Path(path)
    if path.suffix == ".onnx":
        return OnnxRuntime(path, threads)
    if path.suffix == ".pt2":
        import torch

        from project.pt2e import load_int8

        module, _ = load_int8(path)
        return TorchRuntime(torch.compile(module) if compile else module, set_eval=False)
    raise UserError(f"QAT artifact {path}: expected a .pt2 (torch.export) or .onnx file")
