"""Each export checked right after it is written: run as a deployment runs it, against the eager network.

A format's file is loaded back (ONNX Runtime for ONNX, after `onnx.checker`; `torch.jit.load`;
`torch._inductor.aoti_load_package`) and run on random batches of VERIFY_BATCH_SIZES images; the largest
absolute difference from eager is printed and returned, and above the tolerance the export fails (`export`
writes nothing then).
"""

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from project.errors import UserError
from project.export.aoti import load_aoti
from project.export.runtimes import INPUT_NAME, ort_session

#: Batch sizes of the random verification batches: 1 (serving) and one that is not the export's example (2).
VERIFY_BATCH_SIZES = (1, 5)


def verify_onnx(
    net: nn.Module, path: str | Path, input_shape: tuple[int, int, int], atol: float = 1e-4
) -> float:
    """Check the file with `onnx.checker`, then compare ONNX Runtime with eager (see `compare_with_eager`)."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as e:
        raise UserError(f"the exported ONNX model fails onnx.checker: {e}") from None
    session = ort_session(path)

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {INPUT_NAME: x.numpy()})[0])

    return compare_with_eager(net, run, input_shape, "ONNX Runtime", atol, label="onnxruntime")


def compare_with_eager(
    net: nn.Module,
    run: Callable[[torch.Tensor], torch.Tensor],
    input_shape: tuple[int, int, int],
    name: str,
    atol: float,
    label: str = "exported",
    seed: int = 0,
) -> float:
    """The largest absolute difference between `run` and the eager network on random batches of
    VERIFY_BATCH_SIZES images; a UserError (nothing gets written) above `atol`, a wrong shape, or NaN."""
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for batch_size in VERIFY_BATCH_SIZES:
        x = torch.randn(batch_size, *input_shape, generator=generator)
        with torch.inference_mode():
            expected, got = net(x).float(), run(x).float()
        if got.shape != expected.shape:
            raise UserError(
                f"{name} returned shape {tuple(got.shape)} for batch {batch_size}, eager {tuple(expected.shape)}"
            )
        diff = float((got - expected).abs().max())
        print(f"{label}: batch {batch_size}: max |{label} - eager| = {diff:.3g}")
        worst = max(worst, diff)
    if not worst <= atol:  # also catches NaN
        raise UserError(
            f"{name} output differs from eager by up to {worst:.3g}, above the tolerance --atol {atol:g}; "
            "nothing was written"
        )
    return worst


def verify_torchscript(
    net: nn.Module, path: str | Path, input_shape: tuple[int, int, int], atol: float = 1e-4
) -> float:
    """Reload the saved module and compare it with eager (see `compare_with_eager`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        loaded = torch.jit.load(str(path), map_location="cpu")
    return compare_with_eager(net, loaded, input_shape, "TorchScript", atol, label="torchscript")


def verify_aoti(
    net: nn.Module,
    path: str | Path,
    input_shape: tuple[int, int, int],
    atol: float = 1e-4,
    device: str = "cpu",
) -> float:
    """Load the package as a deployment does and compare it with eager (see `compare_with_eager`); the package
    runs on `device`, the eager network on the CPU."""
    compiled = load_aoti(path)

    def run(x: torch.Tensor) -> torch.Tensor:
        return compiled(x.to(device)).cpu()

    return compare_with_eager(net, run, input_shape, "The AOTInductor package", atol, label="aoti")
