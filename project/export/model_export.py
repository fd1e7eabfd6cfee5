"""`python -m project export`: a checkpoint to ONNX and/or TorchScript, verified, with its preprocessing JSON.

ONNX goes through the dynamo exporter (`torch.export` based) with a dynamic batch axis and is checked with
`onnx.checker` and against eager in ONNX Runtime. TorchScript is made with `torch.jit.script`, falling back to
`torch.jit.trace` with a warning that says why; TorchScript is deprecated upstream (torch 2.14 warns on every
`torch.jit.script` call) in favour of `torch.export` and ONNX, and is kept for C++ (libtorch) consumers. Its
deprecation notice is silenced here because the user asked for the format explicitly.
"""

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn

from project.atomic_files import check_writable, staged_outputs
from project.errors import UserError
from project.export.decoding import deployed
from project.export.runtimes import INPUT_NAME, OUTPUT_NAME, ort_session
from project.export.trained import TrainedModel, load_trained

#: ONNX opset written by default: 18 is the dynamo exporter's native opset and is run by every
#: ONNX Runtime release since 1.14, including its quantization tools.
DEFAULT_OPSET = 18
#: Batch sizes of the random verification batches: 1 (serving) and one that is not the export's example (2).
VERIFY_BATCH_SIZES = (1, 5)


def export_onnx(
    net: nn.Module,
    input_shape: tuple[int, int, int],
    path: str | Path,
    opset: int = DEFAULT_OPSET,
    output_name: str = OUTPUT_NAME,
) -> None:
    """Write `net` (eval mode) to `path` as one self-contained ONNX file with a dynamic batch axis, its input
    named `input` and its output `output_name`.

    Uses the dynamo exporter (`torch.export` based); if the network cannot be captured by it, falls
    back to the TorchScript-based exporter with a warning that says why.
    """
    example = torch.randn(2, *input_shape)
    common = {"input_names": [INPUT_NAME], "output_names": [output_name], "opset_version": opset}
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
            dynamic_axes={INPUT_NAME: {0: "batch"}, output_name: {0: "batch"}},
            **common,
        )


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
                # Tracing a Module (not a function) gives a ScriptModule.
                traced = cast(torch.jit.ScriptModule, torch.jit.trace(net, torch.randn(2, *input_shape)))
                module, method = traced, "trace"
        module.save(str(path))
    return method


def verify_torchscript(
    net: nn.Module, path: str | Path, input_shape: tuple[int, int, int], atol: float = 1e-4
) -> float:
    """Reload the saved module and compare it with eager (see `compare_with_eager`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        loaded = torch.jit.load(str(path), map_location="cpu")
    return compare_with_eager(net, loaded, input_shape, "TorchScript", atol, label="torchscript")


FILES = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt"}
METADATA = "model.json"


def claim_output_dir(output_dir: str | Path, overwrite: bool, outputs: tuple[str, ...]) -> list[str]:
    """Check that `output_dir` can take the files `outputs`; returns those of them already there.

    A folder that already holds some of them (an earlier export) is refused unless `overwrite`: its model.json
    would otherwise end up describing a mix of two checkpoints.
    """
    output_dir = Path(output_dir)
    check_writable(output_dir, "output_dir")
    present = [name for name in outputs if (output_dir / name).exists()]
    if present and not overwrite:
        raise UserError(
            f"--output_dir {output_dir} already holds {', '.join(present)} from an earlier run: choose another "
            "--output_dir, or replace them with --overwrite true"
        )
    return present


def export_trained(
    trained: TrainedModel,
    output_dir: str | Path,
    formats: tuple[str, ...] = ("onnx", "torchscript"),
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write each format and `model.json` into `output_dir`, all or nothing; returns the JSON's content.

    With `overwrite`, an earlier export there is replaced whole: its files of formats not written now go too.
    """
    present = claim_output_dir(output_dir, overwrite, (*FILES.values(), METADATA))
    pre = trained.preprocessing
    # The task's account of its outputs (checkpoints written before tasks recorded one are single-label); a
    # multi-label network is exported with its sigmoid, its outputs the tags' probabilities.
    net, task, decoder = deployed(trained.net.eval(), trained.outputs, pre.class_names)
    net.eval()
    meaning = (
        f"{task['outputs']}; {task['decode']}" if "decode" in task else "logits; softmax gives probabilities"
    )
    meta: dict[str, Any] = {
        "preprocessing": pre.to_dict(),
        "input": {
            "name": INPUT_NAME,
            "shape": ["batch", *pre.input_shape],
            "dtype": "float32",
            "layout": "NCHW, RGB",
            "steps": pre.steps(),
        },
        "output": {
            "name": decoder.output_name,
            "shape": ["batch", pre.num_classes],
            "meaning": meaning,
        },
        "task": task,
        "source": {
            "checkpoint": str(trained.ckpt_path),
            "network": type(trained.net).__name__,
            "torch": torch.__version__,
        },
        "files": {},
    }
    with staged_outputs(output_dir, replaces=present) as staging:
        if "onnx" in formats:
            export_onnx(net, pre.input_shape, staging / FILES["onnx"], opset, decoder.output_name)
            diff = verify_onnx(net, staging / FILES["onnx"], pre.input_shape, atol=atol)
            meta["files"]["onnx"] = {"path": FILES["onnx"], "opset": opset, "max_abs_diff_vs_eager": diff}
        if "torchscript" in formats:
            method = export_torchscript(net, pre.input_shape, staging / FILES["torchscript"])
            diff = verify_torchscript(net, staging / FILES["torchscript"], pre.input_shape, atol=atol)
            meta["files"]["torchscript"] = {
                "path": FILES["torchscript"],
                "method": method,
                "max_abs_diff_vs_eager": diff,
            }
        (staging / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def export(
    ckpt_path: str,
    config: list[str] | None = None,
    format: Literal["onnx", "torchscript", "all"] = "all",
    output_dir: str = "export",
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
    overwrite: bool = False,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Export a trained checkpoint to ONNX and/or TorchScript, verified against the eager model.

    The ONNX file has a dynamic batch axis; right after writing it is checked with onnx.checker and run
    in ONNX Runtime on random batches of two sizes against the eager network. TorchScript is made with
    torch.jit.script, falling back to torch.jit.trace with a warning. model.json beside the models holds
    the input size, mean/std and class names, so a consumer needs nothing else. Files are written to a
    staging folder and moved into place only when every check passed: a failed export leaves no file.

    Args:
        ckpt_path: Checkpoint written by `python -m project fit`.
        config: Config file(s) of the training run.
        format: `onnx`, `torchscript` or `all`.
        output_dir: Folder for model.onnx, model.torchscript.pt and model.json (created if missing).
        opset: ONNX opset version to write.
        atol: Largest accepted absolute difference between exported and eager logits; above it the
            export fails and writes nothing.
        overwrite: Replace an earlier export in output_dir (refused otherwise).
        overrides: --model.* / --data.* flags for the config parser.
    """
    claim_output_dir(output_dir, overwrite, (*FILES.values(), METADATA))  # before the checkpoint is read
    trained = load_trained(ckpt_path, config, overrides)
    formats = ("onnx", "torchscript") if format == "all" else (format,)
    meta = export_trained(trained, output_dir, formats, opset=opset, atol=atol, overwrite=overwrite)
    for fmt, info in meta["files"].items():
        print(f"{fmt}: {Path(output_dir) / info['path']}")
    print(f"preprocessing: {Path(output_dir) / METADATA}")
    return meta


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `export` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(export, args, prog="python -m project export")


def main(args: list[str]) -> None:
    export(**parse_args(args))
