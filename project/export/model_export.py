"""`python -m project export`: a checkpoint to ONNX, an AOTInductor package and/or TorchScript, verified, with its
preprocessing JSON.

ONNX goes through the dynamo exporter (`torch.export` based) with a dynamic batch axis and is checked with
`onnx.checker` and against eager in ONNX Runtime. The AOTInductor package (`model.pt2`, `project.export.aoti`)
is `torch.export` compiled ahead of time, also with a dynamic batch dimension, and is checked against eager
through `torch._inductor.aoti_load_package`; C++ loads it with libtorch (`examples/aoti_cpp/`).

TorchScript is a legacy format, kept for existing libtorch consumers: it is deprecated upstream (torch 2.14 warns
on every `torch.jit.script` call; Lightning deprecated `to_torchscript`) in favour of `torch.export`, whose C++
route is the AOTInductor package. It is made with `torch.jit.script`, falling back to `torch.jit.trace` with a
warning that says why; its deprecation notice is silenced here because the user asked for the format explicitly.
"""

import contextlib
import json
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn

from project.atomic_files import check_writable, no_space_left, staged_outputs
from project.errors import UserError
from project.export.aoti import (
    MAX_BATCH,
    AotiDevice,
    check_device,
    compiled_for,
    disk_full,
    export_aoti,
)
from project.export.decoding import deployed
from project.export.runtimes import INPUT_NAME, OUTPUT_NAME
from project.export.trained import TrainedModel, load_trained
from project.export.verify import verify_aoti, verify_onnx, verify_torchscript

#: ONNX opset written by default: 18 is the dynamo exporter's native opset and is run by every
#: ONNX Runtime release since 1.14, including its quantization tools.
DEFAULT_OPSET = 18


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
        if disk_full(e):  # captured, but the file could not be written: the other exporter would not help
            raise
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
        # Through memory: torch's C++ writer ends the process when the disk fills; a Python write raises.
        Path(path).write_bytes(module.save_to_buffer())
    return method


#: The file each format writes; `all` writes every one, in this order.
FILES = {"onnx": "model.onnx", "aoti": "model.pt2", "torchscript": "model.torchscript.pt"}
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


@contextlib.contextmanager
def writing(
    output_dir: str | Path,
    outcome: str = "nothing was written there",
    fix: str = "Free some space, or choose another --output_dir",
) -> Iterator[None]:
    """A full disk inside the block (while files are staged in `output_dir`, or in the compiler's cache) as one
    UserError line saying `outcome` and `fix`; the `staged_outputs` inside it have removed what they staged."""
    try:
        yield
    except Exception as e:
        if not disk_full(e):
            raise
        # The file's name, not its path in the staging folder (gone by now).
        where = f" ({Path(e.filename).name})" if isinstance(e, OSError) and e.filename else ""
        raise UserError(no_space_left(f"{output_dir}{where}", outcome, fix)) from None


def export_trained(
    trained: TrainedModel,
    output_dir: str | Path,
    formats: tuple[str, ...] = ("onnx", "torchscript"),
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
    overwrite: bool = False,
    device: AotiDevice = "cpu",
) -> dict[str, Any]:
    """Write each format and `model.json` into `output_dir`, all or nothing; returns the JSON's content.

    With `overwrite`, an earlier export there is replaced whole: its files of formats not written now go too.
    `device` is where the AOTInductor package runs (the other formats run anywhere).
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
    with writing(output_dir), staged_outputs(output_dir, replaces=present) as staging:
        if "onnx" in formats:
            export_onnx(net, pre.input_shape, staging / FILES["onnx"], opset, decoder.output_name)
            diff = verify_onnx(net, staging / FILES["onnx"], pre.input_shape, atol=atol)
            meta["files"]["onnx"] = {"path": FILES["onnx"], "opset": opset, "max_abs_diff_vs_eager": diff}
        if "aoti" in formats:
            export_aoti(net, pre.input_shape, staging / FILES["aoti"], device)
            diff = verify_aoti(net, staging / FILES["aoti"], pre.input_shape, atol=atol, device=device)
            meta["files"]["aoti"] = {
                "path": FILES["aoti"],
                "format": "AOTInductor package (torch._inductor.aoti_compile_and_package)",
                "device": device,
                "compiled_for": compiled_for(device),
                "batch": [1, MAX_BATCH],
                "max_abs_diff_vs_eager": diff,
            }
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
    format: Literal["onnx", "aoti", "torchscript", "all"] = "all",
    output_dir: str = "export",
    opset: int = DEFAULT_OPSET,
    atol: float = 1e-4,
    device: AotiDevice = "cpu",
    overwrite: bool = False,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Export a trained checkpoint to ONNX, an AOTInductor package and/or TorchScript, verified against eager.

    ONNX (model.onnx, for ONNX Runtime in any language) has a dynamic batch axis; right after writing it is
    checked with onnx.checker and run in ONNX Runtime on random batches of two sizes against the eager
    network. The AOTInductor package (model.pt2: torch.export compiled ahead of time, with a dynamic batch
    dimension; C++ loads it with libtorch's AOTIModelPackageLoader, Python with
    torch._inductor.aoti_load_package) is the C++ route; compiling it takes a minute or two and a C++
    compiler, and it is checked the same way. TorchScript (model.torchscript.pt) is a legacy format,
    deprecated upstream in favour of torch.export: written by `all` or on request, for existing libtorch
    consumers. model.json beside the models holds the input size, mean/std and class names, so a consumer
    needs nothing else. Files are written to a staging folder and moved into place only when every check
    passed: a failed export leaves no file.

    Args:
        ckpt_path: Checkpoint written by `python -m project fit`.
        config: Config file(s) of the training run.
        format: `onnx`, `aoti` (AOTInductor package), `torchscript` (legacy) or `all`.
        output_dir: Folder for model.onnx, model.pt2, model.torchscript.pt and model.json (created if missing).
        opset: ONNX opset version to write.
        atol: Largest accepted absolute difference between exported and eager logits; above it the
            export fails and writes nothing.
        device: Where the AOTInductor package runs: `cpu`, or `cuda` (compiled on this machine's GPU).
        overwrite: Replace an earlier export in output_dir (refused otherwise).
        overrides: --model.* / --data.* flags for the config parser.
    """
    formats = tuple(FILES) if format == "all" else (format,)
    if "aoti" in formats:
        check_device(device)
    claim_output_dir(output_dir, overwrite, (*FILES.values(), METADATA))  # before the checkpoint is read
    trained = load_trained(ckpt_path, config, overrides)
    meta = export_trained(
        trained, output_dir, formats, opset=opset, atol=atol, overwrite=overwrite, device=device
    )
    for fmt, info in meta["files"].items():
        print(f"{fmt}: {Path(output_dir) / info['path']}")
    print(f"preprocessing: {Path(output_dir) / METADATA}")
    return meta


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `export` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(export, args, prog="python -m project export")


@contextlib.contextmanager
def ctrl_c_says(outcome: str) -> Iterator[None]:
    """Ctrl-C inside the block (staged outputs removed by then) as one line saying `outcome`, exit status 130."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"error: stopped by Ctrl-C; {outcome}", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None


def main(args: list[str]) -> None:
    kwargs = parse_args(args)
    with ctrl_c_says(f"nothing was written to {kwargs.get('output_dir', 'export')}"):
        export(**kwargs)
