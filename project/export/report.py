"""The quantization report: one row per variant, written as Markdown and JSON and logged to W&B."""

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from project.export.files import write_text_atomic

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
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
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


def markdown(results: list[VariantResult], info: dict[str, Any]) -> str:
    rows = table_rows(results)
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    m = info["machine"]
    notes = [
        "",
        f"Accuracy: top-1 on {info['samples']} images of the {info['split']} split; drop in percentage points "
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
    results: list[VariantResult], info: dict[str, Any], output_dir: str | Path
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
    write_text_atomic(js, json.dumps(payload, indent=2) + "\n")
    write_text_atomic(md, markdown(results, info))
    return md, js


def log_to_wandb(
    results: list[VariantResult], info: dict[str, Any], output_dir: str | Path, project: str
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
        mode=os.environ.get("WANDB_MODE", "offline"),
        reinit="finish_previous",
    )
    try:
        run.log({"quantization": wandb.Table(columns=COLUMNS, data=table_rows(results))})
        for r in results:
            run.summary.update(
                {
                    f"{r.key}/accuracy": r.accuracy,
                    f"{r.key}/throughput": r.throughput,
                    f"{r.key}/latency_ms": r.latency_ms,
                }
            )
        return str(run.dir)
    finally:
        run.finish()
