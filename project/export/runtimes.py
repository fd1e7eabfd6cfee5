"""One calling convention for every way to run a model: float32 (B, C, H, W) numpy in, logits out.

The quantization report, `predict_onnx` and `serve` compare or swap eager PyTorch, ONNX Runtime and
INT8 models; wrapping each in a `Runtime` keeps those comparisons to one loop.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from project.export.onnx_export import INPUT_NAME, OUTPUT_NAME, ort_session


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
    session: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.session = ort_session(self.path, threads=self.threads)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(x, dtype=np.float32)})[0]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, computed stably in float64."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def softmax_top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class index, its probability) per row."""
    probs = softmax(logits)
    index = probs.argmax(axis=1)
    return index, probs[np.arange(len(index)), index]
