"""The INT8 deployment table of a trained checkpoint, as benchmark lines: `python -m project quantize`, re-emitted.

Runs the quantize command (FP32 eager, FP32 ONNX Runtime, dynamic INT8, static INT8 and QAT INT8 when a
QAT artifact is next to the checkpoint; accuracy on the chosen split, latency at batch 1, throughput at
batch 64, all measured interleaved in one run) and prints one JSON line per variant, then
`ratio: X` = static INT8 / FP32 eager throughput at batch 64 (the issue's target: at least 2).

    python -m benchmarks.quantize_int8 --ckpt_path logs/runs/version_0/checkpoints/last.ckpt --split val \\
        --output_dir quantize --repeats 30

Every option after the known ones is passed to `python -m project quantize` unchanged.
"""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import emit

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    args = sys.argv[1:]
    if "--output_dir" not in args:
        args += ["--output_dir", "quantize"]
    output_dir = Path(args[args.index("--output_dir") + 1])
    subprocess.run([sys.executable, "-m", "project", "quantize", *args], cwd=ROOT, check=True)
    report = json.loads((ROOT / output_dir / "quantization.json").read_text())
    emit(
        benchmark="quantize_int8",
        **{k: report["info"][k] for k in ("checkpoint", "split", "samples", "machine", "command")},
    )
    by_key = {}
    for r in report["results"]:
        by_key[r["key"]] = r
        emit(
            variant=r["variant"],
            accuracy=round(r["accuracy"], 4),
            drop_points=round(r["drop_points"], 2),
            latency_ms=round(r["latency_ms"], 2),
            throughput=round(r["throughput"], 1),
            speedup=round(r["speedup_vs_fp32_eager"], 2),
            size_mb=round(r["size_mb"], 2),
        )
    print(f"ratio: {by_key['int8_static']['throughput'] / by_key['fp32_eager']['throughput']:.2f}")


if __name__ == "__main__":
    main()
