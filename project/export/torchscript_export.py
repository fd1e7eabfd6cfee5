"""TorchScript export: `torch.jit.script`, falling back to `torch.jit.trace` with a warning that says why.

TorchScript is deprecated upstream (torch 2.14 warns on every `torch.jit.script` call) in favour of
`torch.export` and ONNX; it is kept for C++ (libtorch) consumers and older runtimes. The deprecation
notice is silenced here because the user asked for this format explicitly.
"""

import warnings
from pathlib import Path

import torch
from torch import nn

from project.errors import UserError
from project.export.onnx_export import VERIFY_BATCH_SIZES


def export_torchscript(net: nn.Module, input_shape: tuple[int, int, int], path: str | Path) -> str:
    """Save `net` as TorchScript at `path`; returns the method used, `script` or `trace`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=FutureWarning)
        try:
            module, method = torch.jit.script(net), "script"
        except Exception as e:
            reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            warnings.warn(
                f"torch.jit.script failed ({type(e).__name__}: {reason}); falling back to torch.jit.trace. "
                "A trace records the operations run on one example input: data-dependent control flow "
                "(Python `if`/`for` on tensor values) is frozen to the branch that example took.",
                stacklevel=2,
            )
            with torch.no_grad():
                module, method = torch.jit.trace(net, torch.randn(2, *input_shape)), "trace"
        module.save(str(path))
    return method


def verify_torchscript(
    net: nn.Module, path: str | Path, input_shape: tuple[int, int, int], atol: float = 1e-4, seed: int = 0
) -> float:
    """Reload the saved module and compare it with eager on random batches; UserError above `atol`."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        loaded = torch.jit.load(str(path), map_location="cpu")
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for batch_size in VERIFY_BATCH_SIZES:
        x = torch.randn(batch_size, *input_shape, generator=generator)
        with torch.inference_mode():
            diff = float((loaded(x) - net(x)).abs().max())
        print(f"torchscript: batch {batch_size}: max |torchscript - eager| = {diff:.3g}")
        worst = max(worst, diff)
    if not worst <= atol:
        raise UserError(
            f"TorchScript output differs from eager by up to {worst:.3g}, above --atol {atol:g}; nothing was written"
        )
    return worst
