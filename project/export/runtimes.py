"""One calling convention for every way to run a model: float32 (B, C, H, W) numpy in, outputs out (logits, or
an export's probabilities: `project.export.decoding` reads them).

The quantization report, `predict_onnx` and `serve` compare or swap eager PyTorch, ONNX Runtime, AOTInductor
packages and INT8 models; wrapping each in a `Runtime` keeps those comparisons to one loop. INT8 `torch.export`
programs (`quantize`'s) run under the same convention, in the module that makes them.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch
from torch import nn

from project.errors import UserError

if TYPE_CHECKING:
    import onnxruntime as ort

INPUT_NAME, OUTPUT_NAME = "input", "logits"


def ort_session(path: str | Path, threads: int | None = None) -> "ort.InferenceSession":
    """An ONNX Runtime CPU session with all graph optimisations and `threads` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class Runtime(Protocol):
    """A model behind a plain call: normalised float32 batch -> float32 logits (B, num_classes)."""

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


@dataclass
class TorchRuntime:
    """An `nn.Module` (eager, scripted or an exported program's module) under `torch.inference_mode`.

    `set_eval=False` for `torch.export` programs: they are captured in eval mode and refuse `.eval()`.
    """

    module: nn.Module
    set_eval: bool = True

    def __post_init__(self) -> None:
        if self.set_eval:
            self.module.eval()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.module(torch.from_numpy(x)).float().numpy()


@dataclass
class OnnxRuntime:
    """An ONNX file run by ONNX Runtime on the CPU."""

    path: str | Path
    threads: int | None = None
    session: "ort.InferenceSession" = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.session = ort_session(self.path, threads=self.threads)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # The model's one output, by position: `logits`, or `probabilities` for a multi-label export.
        outputs = self.session.run(None, {INPUT_NAME: np.ascontiguousarray(x, dtype=np.float32)})
        return cast(np.ndarray, outputs[0])  # a dense tensor, not a sparse one, list or map


@dataclass
class AotiRuntime:
    """An AOTInductor package (`export --format aoti`'s `model.pt2`), on the device it was compiled for.

    `threads` sets torch's intra-op threads, which the compiled CPU kernels share (one OpenMP pool).
    """

    path: str | Path
    device: str = "cpu"
    threads: int | None = None
    model: Callable[[torch.Tensor], torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from project.export.aoti import check_device, load_aoti

        check_device(self.device)
        if self.threads:
            torch.set_num_threads(self.threads)
        self.model = load_aoti(self.path)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        batch = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
        with torch.inference_mode():
            return self.model(batch).float().cpu().numpy()


def aoti_device(meta: dict) -> str:
    """The device an export's AOTInductor package was compiled for, as its model.json records it."""
    return (meta.get("files", {}).get("aoti") or {}).get("device", "cpu")


def exported_runtime(path: str | Path, threads: int | None = None) -> Runtime:
    """The runtime of an exported model by its file: `.onnx` in ONNX Runtime, `.pt2` (an AOTInductor package,
    compiled for the device its model.json records) with AOTInductor."""
    from project.export.preprocessing import read_metadata

    path = Path(path)
    if path.suffix == ".onnx":
        return OnnxRuntime(path, threads)
    if path.suffix == ".pt2":
        meta, _ = read_metadata(path)
        return AotiRuntime(path, aoti_device(meta), threads)
    raise UserError(f"model {path}: expected a .onnx file or an AOTInductor .pt2 package written by export")
