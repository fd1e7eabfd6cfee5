"""The INT8 rows of the quantization report: QAT's and PT2E's `torch.export` programs (or INT8 ONNX files),
loaded as they are deployed. Part of the compression part (parts.yaml), as quantize is."""

from pathlib import Path

from project.atomic_files import file_size_mb
from project.errors import UserError
from project.export.runtimes import OnnxRuntime, Runtime, TorchRuntime
from project.export.variants import Variant

#: `model_int8.pt2` is the default name used by `project.compression.qat.QuantizationAwareTraining`.
QAT_PATTERNS = ("*qat*.pt2", "*qat*.onnx", "*int8*.pt2")


def find_qat_artifact(ckpt_path: str | Path) -> Path | None:
    """The newest QAT INT8 artifact in the checkpoint's folder, or None."""
    folder = Path(ckpt_path).parent
    found = {p for pattern in QAT_PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


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
        from project.compression.int8_program import compiled_or_eager, load_int8

        module, _ = load_int8(path)
        if not compile:
            return TorchRuntime(module, set_eval=False), "torch.export program, uncompiled"
        module, failure = compiled_or_eager(module, input_shape)
        how = (
            "torch.compile (freezing)" if failure is None else f"uncompiled: torch.compile failed ({failure})"
        )
        return TorchRuntime(module, set_eval=False), how
    raise UserError(f"INT8 model {path}: expected a .pt2 (torch.export) or .onnx file")


def int8_variant(
    name: str, key: str, path: Path, input_shape: tuple[int, ...], threads: int | None, compile: bool = True
) -> Variant:
    """An INT8 `.pt2` program (PT2E static or QAT) or `.onnx` model; `.pt2` under torch.compile if it can."""
    runtime, runs_on = load_int8_runtime(path, input_shape, threads, compile=compile)
    return Variant(name, key, runtime, file_size_mb(path), str(path), runs_on)
