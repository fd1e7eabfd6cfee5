"""The quantization report: each variant's accuracy and speed measured side by side, one row per variant,
written as Markdown and JSON and logged to W&B.

Speed is measured interleaved: each repeat runs every variant once, in turn, so a burst of load from another
process on a shared CPU slows all variants alike instead of whichever ran at that moment. Each figure is the
median of the repeats, after warm-up runs (first-call allocations, kernel selection).
"""

import json
import os
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from project.atomic_files import atomic_write_text
from project.data.targets import OneClass
from project.export.decoding import Decoder
from project.export.runtimes import Runtime
from project.machine import available_cpus

COLUMNS = [
    "variant",
    "accuracy",
    "drop vs FP32",
    "latency batch 1",
    "throughput batch 64",
    "speed-up vs FP32 eager",
    "size",
    "top-1 agrees with FP32",
]
#: How the figures of a model with one class per image are read (the report's default).
ONE_CLASS = OneClass(())


def columns(decoder: Decoder = ONE_CLASS) -> list[str]:
    """The table's columns, with the task's quality figure (accuracy, mAP) and what agreement compares."""
    return [COLUMNS[0], decoder.quality, *COLUMNS[2:-1], decoder.agrees]


@dataclass
class VariantResult:
    """Measured figures of one model variant (`key`: a short name for W&B, e.g. `int8_static`)."""

    key: str
    variant: str
    accuracy: float
    agreement: float
    latency_ms: float
    throughput: float
    size_mb: float
    artifact: str
    runtime: str = ""


def time_interleaved(
    runtimes: Mapping[str, Runtime], x: np.ndarray, warmup: int = 3, repeats: int = 20
) -> dict[str, float]:
    """Median seconds per call of each runtime on input `x`."""
    for _ in range(warmup):
        for run in runtimes.values():
            run(x)
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    for _ in range(repeats):
        for name, run in runtimes.items():
            start = time.perf_counter()
            run(x)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def speed(
    runtimes: Mapping[str, Runtime],
    sample: np.ndarray,
    batch_size: int = 64,
    warmup: int = 3,
    repeats: int = 20,
) -> dict[str, dict[str, float]]:
    """Latency at batch 1 (ms, median) and throughput at `batch_size` (images/s, from the median batch time).

    `sample` is a real normalised batch; it is tiled up to `batch_size` if smaller.
    """
    reps = -(-batch_size // len(sample))
    batch = np.ascontiguousarray(np.concatenate([sample] * reps)[:batch_size])
    single = np.ascontiguousarray(sample[:1])
    latency = time_interleaved(runtimes, single, warmup, repeats)
    batch_time = time_interleaved(runtimes, batch, warmup, max(3, repeats // 2))
    return {
        name: {"latency_ms": 1000 * latency[name], "throughput": batch_size / batch_time[name]}
        for name in runtimes
    }


def accuracy(
    runtimes: Mapping[str, Runtime],
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    reference: str,
    decoder: Decoder = ONE_CLASS,
) -> tuple[dict[str, dict[str, float]], int]:
    """Each runtime's quality figure on labelled batches (`decoder.quality`: top-1 accuracy, or mAP for tags),
    its agreement with `reference` (same top-1 class, or same tag set), and the number of samples."""
    kept: dict[str, list[np.ndarray]] = {name: [] for name in runtimes}
    targets = []
    for x, y in batches:
        for name, run in runtimes.items():
            kept[name].append(decoder.reduce(run(x)))
        targets.append(y)
    if not targets or sum(len(y) for y in targets) == 0:
        raise ValueError("no evaluation samples")
    labels = np.concatenate(targets)
    reduced = {name: np.concatenate(parts) for name, parts in kept.items()}
    return {
        name: {
            "accuracy": decoder.score(reduced[name], labels),
            "agreement": decoder.agreement(reduced[name], reduced[reference]),
        }
        for name in runtimes
    }, len(labels)


def machine() -> dict[str, Any]:
    """The CPU and library versions the figures were measured with."""
    import onnxruntime
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = available_cpus()
    return {
        "cpu": cpu,
        "cpus": cpus,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


def table_rows(results: list[VariantResult], batch_size: int = 64) -> list[list[str]]:
    """Formatted cells, the first result (FP32 eager) being the reference for drop and speed-up."""
    ref = results[0]
    rows = []
    for r in results:
        rows.append(
            [
                r.variant,
                f"{100 * r.accuracy:.2f}%",
                f"{100 * (ref.accuracy - r.accuracy):+.2f} pts" if r is not ref else "—",
                f"{r.latency_ms:.2f} ms",
                f"{r.throughput:.0f} img/s",
                f"{r.throughput / ref.throughput:.2f}x",
                f"{r.size_mb:.1f} MB",
                f"{100 * r.agreement:.2f}%",
            ]
        )
    return rows


def markdown(results: list[VariantResult], info: dict[str, Any], decoder: Decoder = ONE_CLASS) -> str:
    rows = table_rows(results)
    names = columns(decoder)
    lines = [
        "| " + " | ".join(names) + " |",
        "|" + "|".join("---" for _ in names) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    m = info["machine"]
    notes = [
        "",
        f"{decoder.quality_note} on {info['samples']} images of the {info['split']} split; drop in percentage points "
        "against FP32 eager (positive = worse).",
        f"Speed: {m['cpu']}, {m['cpus']} CPUs, threads per variant: {info['threads']}; median of "
        f"{info['repeats']} interleaved runs after {info['warmup']} warm-up runs; throughput at batch "
        f"{info['batch_size']}. torch {m['torch']}, onnxruntime {m['onnxruntime']}.",
        f"Static INT8: ONNX Runtime QDQ, calibrated on {info['calibration_batches']} training batches "
        f"({info['calibration']}).",
        f"Command: `{info['command']}`",
    ]
    notes.append("Run by: " + "; ".join(f"{r.variant}: {r.runtime} ({r.artifact})" for r in results) + ".")
    if info.get("qat") is None:
        notes.append("QAT INT8: no QAT artifact was given or found next to the checkpoint.")
    return "\n".join(lines + notes) + "\n"


def write_report(
    results: list[VariantResult], info: dict[str, Any], output_dir: str | Path, decoder: Decoder = ONE_CLASS
) -> tuple[Path, Path]:
    """quantization.md and quantization.json in `output_dir` (each written atomically)."""
    output_dir = Path(output_dir)
    md, js = output_dir / "quantization.md", output_dir / "quantization.json"
    ref = results[0]
    payload = {
        "info": info,
        "results": [
            asdict(r)
            | {
                "drop_points": 100 * (ref.accuracy - r.accuracy),
                "speedup_vs_fp32_eager": r.throughput / ref.throughput,
            }
            for r in results
        ],
    }
    atomic_write_text(js, json.dumps(payload, indent=2) + "\n")
    atomic_write_text(md, markdown(results, info, decoder))
    return md, js


def log_to_wandb(
    results: list[VariantResult],
    info: dict[str, Any],
    output_dir: str | Path,
    project: str,
    decoder: Decoder = ONE_CLASS,
) -> str:
    """Log the table (and each variant's figures in the summary) to a W&B run; returns the run's folder.

    Offline unless WANDB_MODE says otherwise, like the training runs: no account or network needed.
    """
    import wandb

    run = wandb.init(
        project=project,
        dir=str(output_dir),
        job_type="quantize",
        config=info,
        # W&B checks the mode itself; its settings also take `dryrun` and `run`, which init's annotation omits.
        mode=os.environ.get("WANDB_MODE", "offline"),  # pyright: ignore[reportArgumentType]
        reinit="finish_previous",
    )
    try:
        run.log({"quantization": wandb.Table(columns=list(columns(decoder)), data=table_rows(results))})
        for r in results:
            run.summary.update(
                {
                    f"{r.key}/{decoder.quality}": r.accuracy,
                    f"{r.key}/throughput": r.throughput,
                    f"{r.key}/latency_ms": r.latency_ms,
                }
            )
        return str(run.dir)
    finally:
        run.finish()
