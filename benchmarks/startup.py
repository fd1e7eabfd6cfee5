"""Start-up: from the command to the first training step, as whole processes, for an image folder (warm cache)
and for CIFAR-10; and `python -m project --help`.

The first-step time is counted from the process's own start (interpreter, imports, parsing, data, model) to the
start of the first training step (benchmarks.clock.FitClock). CIFAR-10 is read from torchvision's format in
`--cifar-dir`; `--make-cifar` writes that format there from the class-folder JPEGs (the real archive cannot
be downloaded on a machine without network), and then torchvision's checksum check is skipped for those files,
as the tests do (benchmarks/patched_cifar.py). Runs are interleaved, `--repeats` times; medians are reported.

    python -m benchmarks.startup --folder /tmp/cifar60k --cifar-dir /tmp/cifar10py --make-cifar /tmp/cifar10/train
"""

import argparse
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import emit, machine, warm_bytecode
from benchmarks.fit_vs_plain import ROOT, run

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_cifar(jpegs: Path, out: Path) -> None:
    """torchvision's CIFAR-10 files (5 training batches of 10,000, a test batch) from 32x32 class-folder JPEGs."""
    folder = out / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    files = [(f, label) for label, name in enumerate(CLASSES) for f in sorted((jpegs / name).glob("*.jpg"))]
    order = np.random.default_rng(0).permutation(len(files))
    data = np.stack([np.asarray(Image.open(files[i][0]).convert("RGB")) for i in order])
    labels = [files[i][1] for i in order]
    flat = data.transpose(0, 3, 1, 2).reshape(len(data), -1)
    for b in range(5):
        part = slice(b * 10_000, (b + 1) * 10_000)
        (folder / f"data_batch_{b + 1}").write_bytes(
            pickle.dumps({"data": flat[part], "labels": labels[part]})
        )
    (folder / "test_batch").write_bytes(pickle.dumps({"data": flat[:10_000], "labels": labels[:10_000]}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": CLASSES}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="class folders of JPEGs")
    parser.add_argument("--cifar-dir", type=Path, required=True, help="CIFAR-10 in torchvision's format")
    parser.add_argument(
        "--make-cifar", type=Path, help="write --cifar-dir from these class-folder JPEGs first"
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.make_cifar:
        make_cifar(args.make_cifar, args.cifar_dir)
    emit(
        benchmark="startup",
        **machine(),
        folder=str(args.folder),
        images=sum(1 for _ in args.folder.rglob("*.jpg")),
    )
    with tempfile.TemporaryDirectory() as logs:
        short = ["--model.net", "SimpleCNN", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2"]
        short += ["--trainer.callbacks+=benchmarks.clock.FitClock", "--trainer.callbacks.warmup", "1"]
        common = [*short, "--trainer.default_root_dir", logs]
        cmds = {
            "folder": [sys.executable, "-m", "project", "fit", "--config", "configs/folder.yaml",
                       "--data.root", str(args.folder), "--data.image_size", "32", *common],
            "cifar": [sys.executable, "-m", "benchmarks.patched_cifar", "fit", "--config", "configs/cifar10.yaml",
                      "--data.data_dir", str(args.cifar_dir), "--data.download", "false", *common],
        }  # fmt: skip
        warm_bytecode()
        subprocess.run(cmds["folder"], cwd=ROOT, capture_output=True, check=True)  # the image cache, warm
        rows: dict[str, list[dict]] = {"folder": [], "cifar": [], "help": []}
        for repeat in range(args.repeats):
            for name, command in cmds.items():
                rows[name].append(run(command))
                emit(repeat=repeat, command=name, **rows[name][-1])
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "project", "--help"], cwd=ROOT, capture_output=True, check=True
            )
            rows["help"].append({"wall_s": round(time.perf_counter() - start, 3)})
            emit(repeat=repeat, command="help", **rows["help"][-1])
    emit(
        first_step_s={k: statistics.median(r["first_step_s"] for r in rows[k]) for k in ("folder", "cifar")},
        help_wall_s=statistics.median(r["wall_s"] for r in rows["help"]),
    )


if __name__ == "__main__":
    main()
