"""Finding and running INT8 `torch.export` programs (QAT's, or PT2E static) and QAT ONNX models.

The QuantizationAwareTraining callback saves its converted INT8 model next to the checkpoints as a
`torch.export` program (`model_int8.pt2`); `quantize --pt2e_static true` writes one too. Either runs
here under the same calling convention as the other variants.
"""

import warnings
from pathlib import Path

import torch
from torch import nn

from project.errors import UserError
from project.export.runtimes import OnnxRuntime, Runtime, TorchRuntime

#: `model_int8.pt2` is the default name used by `project.callbacks.QuantizationAwareTraining`.
QAT_PATTERNS = ("*qat*.pt2", "*qat*.onnx", "*int8*.pt2")


def find_qat_artifact(ckpt_path: str | Path) -> Path | None:
    """The newest QAT INT8 artifact in the checkpoint's folder, or None."""
    folder = Path(ckpt_path).parent
    found = {p for pattern in QAT_PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def compiled_or_eager(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[nn.Module, str | None]:
    """`project.pt2e.compile_int8(module)` (INT8 kernels), compiled now on a small batch; if compilation
    fails, the module as it is, with a warning: (module to run, why it is not compiled or None)."""
    from project import pt2e

    fast = pt2e.compile_int8(module)
    try:
        with torch.inference_mode():
            fast(torch.zeros(2, *input_shape))
        return fast, None
    except Exception as e:  # Inductor errors vary by torch build and CPU
        torch._dynamo.reset()
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        warnings.warn(
            f"torch.compile of the INT8 program failed ({reason}); it runs uncompiled (quantize/dequantize "
            "around float kernels: INT8 accuracy, not INT8 speed)",
            stacklevel=2,
        )
        return module, reason


def load_int8_runtime(
    path: str | Path, input_shape: tuple[int, ...], threads: int | None = None, compile: bool = True
) -> tuple[Runtime, str]:
    """(runtime, how it runs) for a `.onnx` (ONNX Runtime) or `.pt2` INT8 model.

    A PT2E INT8 program runs its quantize/dequantize pairs around float kernels unless `torch.compile`
    with freezing lowers them to INT8 kernels: `compile` measures that deployed form.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"INT8 model {path} does not exist")
    if path.suffix == ".onnx":
        return OnnxRuntime(path, threads), "ONNX Runtime"
    if path.suffix == ".pt2":
        from project import pt2e

        module, _ = pt2e.load_int8(path)
        if not compile:
            return TorchRuntime(module, set_eval=False), "torch.export program, uncompiled"
        module, failure = compiled_or_eager(module, input_shape)
        how = (
            "torch.compile (freezing)" if failure is None else f"uncompiled: torch.compile failed ({failure})"
        )
        return TorchRuntime(module, set_eval=False), how
    raise UserError(f"INT8 model {path}: expected a .pt2 (torch.export) or .onnx file")
