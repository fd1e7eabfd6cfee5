"""INT8 quantization of an exported ONNX model with ONNX Runtime's quantization tools.

Why ONNX Runtime (see the README for the measurements): its static INT8 path runs INT8 convolutions
with hand-written kernels on any x86-64 CPU (AVX2 and up) without a compiler at load time, and the
result is one `.onnx` file that `serve` and `predict_onnx` run as they run the FP32 export. torchao's
PT2E flow (the successor of the deprecated `torch.ao.quantization`) is what the QAT callback trains
with; its INT8 graph is fast only after `torch.compile`, which builds C++ on first use.
"""

import platform
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, cast

import numpy as np

CalibrationMethod = Literal["minmax", "percentile", "entropy"]
ActivationType = Literal["uint8", "int8"]


# CPU flags of the dot-product instructions that accumulate u8 x s8 products straight into int32.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def needs_reduce_range(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """Whether static INT8 here should use 7-bit weights (`reduce_range`), as ONNX Runtime advises for U8S8.

    x86 CPUs without VNNI multiply u8 activations by s8 weights with `vpmaddubsw`, which adds two products
    into a saturating int16: with full 8-bit weights large sums clip, and a CIFAR ResNet-18's top-1 changes on
    many images (measured in benchmarks/README.md). 7-bit weights cannot overflow. VNNI CPUs (and ARM) accumulate
    in int32 and keep the full 8 bits. `cpuinfo` defaults to /proc/cpuinfo; an x86 CPU whose flags cannot be
    read is treated as lacking VNNI, the safe side (7-bit per-channel weights cost little accuracy).
    """
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = next(
        (line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []
    )
    return not any(flag in flags for flag in VNNI_FLAGS)


def _preprocess(fp32_path: Path, out_path: Path) -> Path:
    """ONNX Runtime's recommended pre-processing: shape inference and graph optimisation (BatchNorm folded
    into the convolutions), so calibration sees the graph that will actually run."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(fp32_path), str(out_path), skip_symbolic_shape=False)
    return out_path


def _input_name(model_path: Path) -> str:
    """The name of the model's (single) input, which the calibration batches are fed to."""
    import onnx

    return onnx.load(str(model_path), load_external_data=False).graph.input[0].name


def quantize_dynamic_linear(fp32_path: str | Path, out_path: str | Path) -> None:
    """Dynamic INT8 of the Linear layers only (MatMul/Gemm): INT8 weights, activations quantized per call.

    No calibration needed; the convolutions stay FP32. The classic first step for Linear-heavy models.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_path = Path(out_path)
    pre = _preprocess(Path(fp32_path), out_path.with_name(out_path.stem + ".pre.onnx"))
    try:
        quantize_dynamic(
            str(pre), str(out_path), op_types_to_quantize=["MatMul", "Gemm"], weight_type=QuantType.QInt8
        )
    finally:
        pre.unlink(missing_ok=True)


class _Batches:
    """ONNX Runtime's CalibrationDataReader protocol over an iterable of float32 (B, C, H, W) arrays."""

    def __init__(self, batches: Iterable[np.ndarray], input_name: str) -> None:
        self._it: Iterator[np.ndarray] = iter(batches)
        self.input_name = input_name
        self.count = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._it, None)
        if batch is None:
            return None
        self.count += 1
        return {self.input_name: np.ascontiguousarray(batch, dtype=np.float32)}

    def rewind(self) -> None:  # part of the reader interface; calibration reads the data once
        pass


def quantize_static_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    calibration_batches: Iterable[np.ndarray],
    method: CalibrationMethod = "minmax",
    activation_type: ActivationType = "uint8",
    per_channel: bool = True,
    reduce_range: bool | None = None,
) -> int:
    """Static INT8 (QDQ format): weights and activations INT8, activation ranges calibrated beforehand.

    Args:
        fp32_path: The FP32 ONNX export.
        out_path: Where the INT8 model goes.
        calibration_batches: Normalised training batches; their activation ranges fix the INT8 scales.
        method: How a range is chosen from the observed values: min/max, a percentile, or entropy.
        activation_type: `uint8` (U8S8: the fast path of x86 AVX2/AVX-512 kernels) or `int8` (S8S8).
        per_channel: One weight scale per output channel (keeps accuracy for convolutions).
        reduce_range: 7-bit weights, for x86 CPUs without VNNI where U8S8 products saturate; default:
            `needs_reduce_range()` for this CPU.

    Returns:
        The number of calibration batches used.
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization import CalibrationMethod as Method

    if reduce_range is None:
        reduce_range = needs_reduce_range()
    out_path = Path(out_path)
    pre = _preprocess(Path(fp32_path), out_path.with_name(out_path.stem + ".pre.onnx"))
    reader = _Batches(calibration_batches, _input_name(pre))
    methods = {"minmax": Method.MinMax, "percentile": Method.Percentile, "entropy": Method.Entropy}
    try:
        quantize_static(
            str(pre),
            str(out_path),
            # A reader by duck typing: CalibrationDataReader's __subclasshook__ accepts any class with get_next.
            cast(CalibrationDataReader, reader),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8 if activation_type == "uint8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=methods[method],
        )
    finally:
        pre.unlink(missing_ok=True)
    return reader.count
