"""Static INT8 with torchao's PT2E flow (post-training): the maintained PyTorch path, beside ONNX Runtime's.

The same building blocks as the QAT callback (`project.pt2e`): `torch.export` capture with a dynamic batch,
`X86InductorQuantizer` (per-channel int8 weights, uint8 activations, conv+BN+ReLU and residual adds fused),
observers calibrated on training batches (`prepare_pt2e`), conversion, and a `.pt2` artifact that
`project.pt2e.load_int8` reads back. It is fast only under `torch.compile` with freezing
(`project.pt2e.compile_int8`), which lowers the quantize/dequantize patterns to oneDNN INT8 kernels.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from project import pt2e


def quantize_pt2e_static(
    net: nn.Module,
    calibration_batches: Iterable[np.ndarray],
    input_shape: tuple[int, int, int],
    path: str | Path,
    metadata: dict[str, Any] | None = None,
) -> int:
    """Quantize an eval-mode float network to INT8 and save it at `path` (.pt2); returns the calibration
    batches used. `net` itself is left unchanged (the capture works on a copy of its graph)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    ao = pt2e._torchao()  # imports torchao quietly, with a clear error if it is missing
    example = torch.zeros(2, *input_shape)
    graph = pt2e.capture(net.eval(), example)
    quantizer = ao.X86InductorQuantizer().set_global(ao.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    used = 0
    with torch.no_grad():
        for batch in calibration_batches:
            prepared(torch.from_numpy(np.ascontiguousarray(batch)))
            used += 1
    pt2e.save_int8(pt2e.convert(prepared), path, example, metadata or {})
    return used
