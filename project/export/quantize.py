"""`python -m project quantize`: the INT8 deployment table for a trained checkpoint."""

import shlex
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from project.atomic_files import staged_outputs
from project.compression.int8_program import save_int8
from project.compression.onnx_int8 import (
    ActivationType,
    CalibrationMethod,
    needs_reduce_range,
    quantize_dynamic_linear,
    quantize_static_int8,
)
from project.compression.pt2e import quantize_static
from project.errors import UserError
from project.export.decoding import deployed
from project.export.int8_variants import find_qat_artifact, int8_variant
from project.export.model_export import (
    FILES,
    METADATA,
    claim_output_dir,
    ctrl_c_says,
    export_trained,
    writing,
)
from project.export.preprocessing import Preprocessing
from project.export.report import (
    VariantResult,
    accuracy,
    log_to_wandb,
    machine,
    markdown,
    speed,
    write_report,
)
from project.export.trained import load_trained
from project.export.variants import aoti_variant, eager_variant, onnx_variant

DYNAMIC_FILE, STATIC_FILE = "model.int8-dynamic.onnx", "model.int8-static.onnx"
PT2E_FILE = "model.int8-pt2e.pt2"
#: What a full disk leaves (each set of files moves into place whole) and what to do about it.
FULL_DISK = (
    "no file there is half-written",
    "Free some space, then run the same command again with --overwrite true",
)


def _network_inputs(batches, pre: Preprocessing) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(uint8 images, targets) loader batches -> (network input as float32 numpy, targets as numpy): cropped,
    resized and normalised as a deployment's consumer does it."""
    for x, y in batches:
        yield pre.normalize(pre.to_input(x)).numpy(), y.numpy()


def quantize(
    ckpt_path: str,
    config: list[str] | None = None,
    output_dir: str = "quantize",
    split: Literal["test", "val"] = "test",
    calibration_batches: int = 16,
    calibration_method: CalibrationMethod = "minmax",
    activation_type: ActivationType = "uint8",
    reduce_range: bool | None = None,
    limit_batches: int | None = None,
    batch_size: int = 64,
    repeats: int = 20,
    warmup: int = 3,
    threads: int | None = None,
    qat_path: str | None = None,
    compile_qat: bool = True,
    pt2e_static: bool = False,
    aoti: bool = True,
    wandb: bool = True,
    wandb_project: str = "lightning-template",
    seed: int = 0,
    overwrite: bool = False,
    overrides: list[str] | None = None,
) -> list[VariantResult]:
    """Measure accuracy, latency, throughput and size of FP32 and INT8 variants of a trained checkpoint.

    Variants: FP32 eager PyTorch; FP32 ONNX Runtime; the FP32 AOTInductor package (`export --format aoti`, on
    the CPU); dynamic INT8 of the Linear layers; static INT8
    calibrated on training batches (both with ONNX Runtime's quantization tools); and the QAT INT8 model
    when a QAT artifact is given or found next to the checkpoint. Accuracy is top-1 on the chosen split
    (for a multi-label model: mAP, and how often the tag sets agree with FP32 eager's);
    speed is the median of interleaved runs on this CPU after warm-up. Writes quantization.md,
    quantization.json and the models (model.onnx, model.pt2, model.int8-*.onnx, model.json) into output_dir,
    and logs the table to W&B (offline unless WANDB_MODE=online).

    Args:
        ckpt_path: Checkpoint written by `python -m project fit`.
        config: Config file(s) of the training run.
        output_dir: Folder for the report and the quantized models.
        split: Split the accuracy is measured on: `test`, or `val` (the held-out validation split).
        calibration_batches: Training batches (of data.batch_size, without augmentation) that calibrate
            the static INT8 activation ranges.
        calibration_method: `minmax`, `percentile` or `entropy` range selection for static INT8.
        activation_type: Static INT8 activations as `uint8` (U8S8, the fast x86 path) or `int8` (S8S8).
        reduce_range: 7-bit INT8 weights for static INT8. Default: on when this CPU is x86 without VNNI,
            whose U8S8 kernels saturate with 8-bit weights (ONNX Runtime's advice; measured on a ResNet-18:
            -5.92 points with 8 bits, -0.22 with 7). Set it for the CPU that will serve the model.
        limit_batches: Evaluate on at most this many batches of the split (default: all of it).
        batch_size: Batch size of the throughput measurement.
        repeats: Timed runs per variant and batch size (the median is reported).
        warmup: Untimed runs per variant before timing.
        threads: CPU threads for every variant (torch and ONNX Runtime alike); default: torch's default.
        qat_path: INT8 model from quantization-aware training (.pt2 or .onnx); default: one found in the
            checkpoint's folder, if any (model_int8.pt2 from the QuantizationAwareTraining callback).
        compile_qat: Run a .pt2 QAT model under torch.compile, which lowers it to INT8 kernels (its
            deployed form; compiled before timing starts; if compilation fails it runs uncompiled, with a
            warning and a note in the report).
        pt2e_static: Add a row for static INT8 with torchao's PT2E flow (X86InductorQuantizer, the same
            calibration batches, torch.compile), saved as model.int8-pt2e.pt2.
        aoti: Compile the FP32 network into an AOTInductor package (model.pt2; a minute or two, with a C++
            compiler) and add its row.
        wandb: Log the table to a W&B run in output_dir.
        wandb_project: W&B project name.
        seed: Seed of the shuffled training batches drawn for calibration (reproducible INT8 scales).
        overwrite: Replace an earlier report and its models in output_dir (refused otherwise).
        overrides: --model.* / --data.* flags for the config parser.
    """
    for name, value in (
        ("calibration_batches", calibration_batches),
        ("batch_size", batch_size),
        ("repeats", repeats),
    ):
        if value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}")
    if threads is not None:
        if threads < 1:
            raise UserError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    if reduce_range is None:
        reduce_range = needs_reduce_range()
    command = (
        "python -m project quantize " + shlex.join(sys.argv[2:]) if sys.argv[1:2] == ["quantize"] else ""
    )

    int8_files = (DYNAMIC_FILE, STATIC_FILE, PT2E_FILE)
    outputs = (*FILES.values(), METADATA, *int8_files, "quantization.md", "quantization.json")
    present = claim_output_dir(output_dir, overwrite, outputs)  # before the checkpoint is read
    trained = load_trained(ckpt_path, config, overrides)
    pre, out = trained.preprocessing, Path(output_dir)
    # Every variant runs what the export holds: a multi-label network with its sigmoid.
    net, _, decoder = deployed(trained.net, trained.outputs, pre.class_names)
    qat_file = Path(qat_path) if qat_path else find_qat_artifact(trained.ckpt_path)
    if qat_file is not None and not qat_file.is_file():
        raise UserError(f"--qat_path {qat_file} does not exist")

    from project.cli.config import build_datamodule

    datamodule = build_datamodule(trained.config)
    datamodule.setup("fit")
    torch.manual_seed(seed)
    calibration = [
        x for x, _ in islice(_network_inputs(datamodule.train_dataloader(), pre), calibration_batches)
    ]

    with writing(out, *FULL_DISK):
        formats = ("onnx", "aoti") if aoti else ("onnx",)
        export_trained(trained, out, formats=formats, overwrite=True)  # the folder was claimed above
        with staged_outputs(out, replaces=[name for name in present if name in int8_files]) as staging:
            quantize_dynamic_linear(out / FILES["onnx"], staging / DYNAMIC_FILE)
            used = quantize_static_int8(
                out / FILES["onnx"],
                staging / STATIC_FILE,
                calibration,
                method=calibration_method,
                activation_type=activation_type,
                reduce_range=reduce_range,
            )
            if pt2e_static:
                example = torch.zeros(2, *pre.input_shape)
                int8 = quantize_static(net, (torch.from_numpy(b) for b in calibration), example)
                save_int8(int8, staging / PT2E_FILE, example, pre.to_dict())

    variants = [
        eager_variant(net, trained.ckpt_path),
        onnx_variant("FP32 ONNX Runtime", "fp32_onnxruntime", out / FILES["onnx"], threads),
        *([aoti_variant(out / FILES["aoti"], threads)] if aoti else []),
        onnx_variant("dynamic INT8 (Linear layers)", "int8_dynamic", out / DYNAMIC_FILE, threads),
        onnx_variant(
            f"static INT8, calibrated on {used} training batches", "int8_static", out / STATIC_FILE, threads
        ),
    ]
    if pt2e_static:
        name = f"static INT8 (torchao PT2E), calibrated on {used} training batches"
        variants.append(int8_variant(name, "int8_pt2e", out / PT2E_FILE, pre.input_shape, threads))
    if qat_file is not None:
        variants.append(int8_variant("QAT INT8", "int8_qat", qat_file, pre.input_shape, threads, compile_qat))
    runtimes = {v.name: v.runtime for v in variants}

    stage = "test" if split == "test" else "validate"
    datamodule.setup(stage)
    loader = datamodule.test_dataloader() if split == "test" else datamodule.val_dataloader()
    batches = islice(_network_inputs(loader, pre), limit_batches)
    scores, samples = accuracy(runtimes, batches, reference="FP32 eager", decoder=decoder)
    sample = calibration[0]
    timing = speed(runtimes, sample, batch_size=batch_size, warmup=warmup, repeats=repeats)

    results = [
        VariantResult(
            key=v.key,
            variant=v.name,
            accuracy=scores[v.name]["accuracy"],
            agreement=scores[v.name]["agreement"],
            latency_ms=timing[v.name]["latency_ms"],
            throughput=timing[v.name]["throughput"],
            size_mb=v.size_mb,
            artifact=v.artifact,
            runtime=v.runs_on,
        )
        for v in variants
    ]
    weights = (
        "7-bit weights (reduce_range: x86 U8S8 without VNNI saturates)" if reduce_range else "int8 weights"
    )
    info = {
        "checkpoint": str(trained.ckpt_path),
        "split": datamodule.tested_split if split == "test" else "validation",
        "samples": samples,
        "calibration_batches": used,
        "calibration": f"{calibration_method}, {activation_type} activations, per-channel {weights}",
        "threads": threads,
        "batch_size": batch_size,
        "repeats": repeats,
        "warmup": warmup,
        "qat": str(qat_file) if qat_file else None,
        "machine": machine(),
        "command": command or f"python -m project quantize --ckpt_path {ckpt_path}",
    }
    with writing(out, *FULL_DISK):
        md, js = write_report(results, info, out, decoder)
    print(markdown(results, info, decoder))
    print(f"report: {md} and {js}")
    if wandb:
        print(f"W&B run: {log_to_wandb(results, info, out, wandb_project, decoder)}")
    return results


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `quantize` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(quantize, args, prog="python -m project quantize")


def main(args: list[str]) -> None:
    kwargs = parse_args(args)
    output_dir = kwargs.get("output_dir", "quantize")
    with ctrl_c_says(f"no file in {output_dir} is half-written"):  # each set of files moves in whole
        quantize(**kwargs)
