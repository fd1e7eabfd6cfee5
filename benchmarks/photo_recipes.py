"""Photo recipes as whole processes, on a photo dataset in root/train, root/val and root/test class folders: the
folder recipe, torchvision's reference data path, the photos preset, each part of the preset alone on top of the
folder recipe, and the compute ceiling; all the same network (torchvision ResNet-18 from scratch), input size
(configs/folder.yaml's 64 px, or `--image-size`), optimizer and schedule.

  folder     python -m project fit --config configs/folder.yaml --data.root ROOT
  photos     ... --config configs/experiment/photos.yaml (batches of 64, random-resized crops from a cache 1.5
             times the input's side, a centred crop for evaluation)
  +crops, +trivial, +erasing, +mix, +ema, +batch64   folder plus one part (+ema: configs/callbacks/ema.yaml)
  reference  python -m benchmarks.torchvision_reference (per-sample RandomResizedCrop from the JPEGs)
  ceiling    the same training steps on tensors in memory (python -m benchmarks.torchvision_reference --in-memory)
  ceiling-photos  the same at the photos preset's batch size (64)

Each template run starts from an empty image cache (a user's first run: the cache build is in its wall time)
and is tested afterwards on root/test from its last checkpoint, by `python -m project test` (not timed). Runs go
one at a time, in the order given (each variant once per seed of `--seeds`, the template's `seed_everything`);
one JSON line per run.

    python -m benchmarks.photo_recipes --root /tmp/clothing --epochs 10 --variants folder photos reference ceiling
    python -m benchmarks.photo_recipes --root /tmp/clothing --epochs 30 --variants folder photos --seeds 42 1 7
    python -m benchmarks.photo_recipes --root /tmp/clothing --epochs 10 --variants folder photos --seeds 42 1 7 --image-size 96
"""

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit, machine, warm_bytecode

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ["--config", "configs/folder.yaml"]
PARTS = {
    "folder": [],
    "photos": ["--config", "configs/experiment/photos.yaml"],
    "+crops": ["--data.cache_size", "96", "--data.augment.crop_scale", "[0.25, 1.0]"],
    "+trivial": ["--data.augment.trivial_augment", "true"],
    "+erasing": ["--data.augment.random_erasing", "0.25"],
    "+mix": [
        "--data.augment.mixup_alpha",
        "0.2",
        "--data.augment.cutmix_alpha",
        "1.0",
        "--data.augment.mix_prob",
        "0.5",
    ],
    "+ema": ["--config", "configs/callbacks/ema.yaml"],
    "+batch64": ["--data.batch_size", "64"],
}
# Batch sizes of the runs outside the template: the folder recipe's (and the photos preset's, for ceiling-photos).
BATCH_SIZES = {"reference": 128, "ceiling": 128, "ceiling-photos": 64}


def run(command: list[str]) -> tuple[str, float]:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:6])} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr, wall


def template(variant: str, args: argparse.Namespace, work: Path, seed: int | None) -> dict:
    config = [
        *FOLDER,
        *PARTS[variant],
        *([] if args.image_size is None else ["--data.image_size", str(args.image_size)]),
        *args.extra,
        "--data.root",
        str(args.root),
        "--data.cache_dir",
        str(work / "cache"),
    ]
    config += [] if seed is None else ["--seed_everything", str(seed)]
    run_root = work / "runs"
    fit = [
        sys.executable, "-m", "project", "fit", *config, "--trainer.max_epochs", str(args.epochs),
        "--trainer.default_root_dir", str(run_root), "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks+=benchmarks.clock.FitClock", "--trainer.callbacks.warmup", "0",
    ]  # fmt: skip
    out, wall = run(fit)
    clock = json.loads(next(x for x in out.splitlines() if x.startswith("CLOCK ")).removeprefix("CLOCK "))
    (last,) = run_root.glob("**/checkpoints/last.ckpt")
    test = [
        sys.executable,
        "-m",
        "project",
        "test",
        *config,
        "--ckpt_path",
        str(last),
        "--trainer.logger",
        "false",
    ]
    out, _ = run(test)
    match = re.search(r"test/acc\s*[│|]\s*([0-9.]+)", out)
    if match is None:
        raise SystemExit(f"no test/acc in the output of {' '.join(test)}:\n{out[-3000:]}")
    train_s = clock["train_end_s"] - clock["first_step_s"]
    return {"test_acc": float(match.group(1)), "wall_s": round(wall, 1), "first_step_s": clock["first_step_s"],
            "train_s": round(train_s, 1)}  # fmt: skip


def reference(args: argparse.Namespace, in_memory: bool, batch_size: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.torchvision_reference", "--root", str(args.root)]
    command += ["--epochs", str(args.epochs), "--batch-size", str(batch_size)]
    command += [] if args.image_size is None else ["--size", str(args.image_size)]
    command += ["--in-memory"] if in_memory else []
    out, wall = run(command)
    record = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))
    if not in_memory:
        record["train_s"] = round(record["train_end_s"] - record["first_step_s"], 1)
    return {**record, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=["folder", "photos", "reference", "ceiling"])
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[None],
        help="template runs: seed_everything (default: the config's)",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="the input's side for every run (default: configs/folder.yaml's data.image_size, 64)",
    )
    parser.add_argument(
        "--extra",
        type=shlex.split,
        default=[],
        help='arguments added to every template run\'s config, e.g. "--data.batch_size 64"',
    )
    args = parser.parse_args()
    emit(
        benchmark="photo_recipes",
        **machine(),
        root=str(args.root),
        epochs=args.epochs,
        image_size=args.image_size,
        extra=args.extra,
    )
    warm_bytecode()
    for variant in args.variants:
        if variant in BATCH_SIZES:
            record = reference(args, in_memory=variant != "reference", batch_size=BATCH_SIZES[variant])
            emit(**{**record, "variant": variant})
            continue
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as work:
                emit(
                    variant=variant,
                    epochs=args.epochs,
                    image_size=args.image_size,
                    seed=seed,
                    **template(variant, args, Path(work), seed),
                )


if __name__ == "__main__":
    main()
