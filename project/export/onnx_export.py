"""ONNX export with a dynamic batch axis, checked with `onnx.checker` and against eager in ONNX Runtime."""

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.errors import UserError

#: ONNX opset written by default: 18 is the dynamo exporter's native opset and is run by every
#: ONNX Runtime release since 1.14, including its quantization tools.
DEFAULT_OPSET = 18
#: Batch sizes of the random verification batches: 1 (serving) and one that is not the export's example (2).
VERIFY_BATCH_SIZES = (1, 5)
INPUT_NAME, OUTPUT_NAME = "input", "logits"


def export_onnx(
    net: nn.Module, input_shape: tuple[int, int, int], path: str | Path, opset: int = DEFAULT_OPSET
) -> None:
    """Write `net` (eval mode) to `path` as one self-contained ONNX file with a dynamic batch axis.

    Uses the dynamo exporter (`torch.export` based); if the network cannot be captured by it, falls
    back to the TorchScript-based exporter with a warning that says why.
    """
    example = torch.randn(2, *input_shape)
    common = {"input_names": [INPUT_NAME], "output_names": [OUTPUT_NAME], "opset_version": opset}
    try:
        torch.onnx.export(
            net,
            (example,),
            str(path),
            dynamo=True,
            external_data=False,  # one file: weights inline (models up to 2 GB)
            dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1 << 16)},),
            verbose=False,
            **common,
        )
    except Exception as e:  # torch.export could not capture the network (e.g. data-dependent control flow)
        warnings.warn(
            f"the dynamo ONNX exporter failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]}); "
            "falling back to the TorchScript-based exporter",
            stacklevel=2,
        )
        torch.onnx.export(
            net,
            (example,),
            str(path),
            dynamo=False,
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            **common,
        )


def ort_session(path: str | Path, threads: int | None = None):
    """An ONNX Runtime CPU session with all graph optimisations and `threads` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def verify_onnx(
    net: nn.Module,
    path: str | Path,
    input_shape: tuple[int, int, int],
    atol: float = 1e-4,
    batch_sizes: tuple[int, ...] = VERIFY_BATCH_SIZES,
    seed: int = 0,
) -> float:
    """Check the file with `onnx.checker`, then compare ONNX Runtime with eager on random batches.

    Returns the largest absolute difference of the logits; raises UserError above `atol`.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as e:
        raise UserError(f"the exported ONNX model fails onnx.checker: {e}") from None
    session = ort_session(path)
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for batch_size in batch_sizes:
        x = torch.randn(batch_size, *input_shape, generator=generator)
        with torch.inference_mode():
            expected = net(x).float().numpy()
        got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
        if got.shape != expected.shape:
            raise UserError(
                f"ONNX Runtime returned shape {got.shape} for batch {batch_size}, eager {expected.shape}"
            )
        diff = float(np.abs(got - expected).max())
        print(f"onnx: batch {batch_size}: max |onnxruntime - eager| = {diff:.3g}")
        worst = max(worst, diff)
    if not worst <= atol:  # also catches NaN
        raise UserError(
            f"ONNX Runtime output differs from eager by up to {worst:.3g}, above the tolerance --atol {atol:g}; "
            "nothing was written"
        )
    return worst
