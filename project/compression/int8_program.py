"""INT8 programs: a converted PT2E graph saved as a `torch.export` program with its metadata, loaded back,
and compiled to oneDNN INT8 kernels.

Run uncompiled, an INT8 program computes quantize/dequantize around float kernels (exact INT8 numerics, FP32
speed or slower); `torch.compile` with Inductor's freezing lowers those patterns to INT8 kernels.
"""

import io
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from project.atomic_files import atomic_path
from project.compression.pt2e import torchao_api
from project.errors import UserError

METADATA_FILE = "metadata.json"


def save_int8(model: GraphModule, path: str | Path, example: Tensor, metadata: dict[str, Any]) -> Path:
    """Saves an INT8 graph as a `torch.export` program (`.pt2`, dynamic batch) with `metadata` inside.

    Written to a temporary file and renamed, so a failure never leaves a partial artifact.
    """
    path = Path(path)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (example.cpu(),), dynamic_shapes=({0: batch},))
    # Through memory: torch's C++ zip writer ends the whole process when the disk fills (it raises, then
    # terminates in its destructor); a Python write of the same bytes raises OSError (ENOSPC) instead.
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_FILE: json.dumps(metadata, indent=2)})
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getbuffer())
    return path


class _CompiledInt8(nn.Module):
    """A `torch.compile`d INT8 graph, always called with Inductor's freezing on and without gradients."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.compiled = torch.compile(model)

    def forward(self, *args: Tensor) -> Tensor:
        # Freezing must be on while Inductor compiles (first call, and each new input shape). Passing it as
        # torch.compile(options=...) instead fails to lower onednn.qconv_prepack (torch 2.14).
        from torch._inductor import config as inductor_config  # a submodule: `import torch` leaves it out

        with inductor_config.patch(freezing=True), torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="To copy construct from a tensor"
            )  # inside torch's lowering
            return self.compiled(*args)


def compile_int8(model: nn.Module) -> nn.Module:
    """`torch.compile` for an INT8 graph, with Inductor's freezing: the weights become constants, so the
    quantize/dequantize patterns are lowered to oneDNN INT8 kernels (without freezing they stay float ops, no
    faster than FP32). For inference only (runs without gradients); the first call compiles (seconds to
    minutes, with the machine's C++ compiler)."""
    return _CompiledInt8(model)


def load_int8(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Loads an INT8 program saved by `save_int8`: returns (module, metadata). Run the module on the CPU, as
    is (quantize/dequantize around float kernels: exact INT8 numerics, FP32 speed or slower) or through
    `compile_int8` (INT8 kernels: several times faster than FP32 on x86)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"INT8 model {path} does not exist")
    torchao_api()  # registers the quantized_decomposed ops the program calls
    extra = {METADATA_FILE: ""}
    try:
        program = torch.export.load(path, extra_files=extra)
    except Exception as e:
        raise UserError(f"{path} is not a readable torch.export program: {e}") from None
    metadata = json.loads(extra[METADATA_FILE]) if extra[METADATA_FILE] else {}
    return program.module(), metadata


def compiled_or_eager(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[nn.Module, str | None]:
    """`compile_int8(module)` (INT8 kernels), compiled now on a small batch; if compilation
    fails, the module as it is, with a warning: (module to run, why it is not compiled or None)."""
    fast = compile_int8(module)
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
