"""`python -m project fit` against the plain PyTorch recipe, as whole processes from the command line.

Same network (SimpleCNN), same batch (64), same number of training steps, same JPEG folder:

  template : python -m project fit --config configs/folder.yaml --model.net SimpleCNN --data.image_size 32
             (its defaults: W&B and CSV logging, checkpoints, diagnostics, the warm image cache), training only
             (--trainer.limit_val_batches 0: the plain loop validates nothing either)
  plain    : python -m benchmarks.plain_recipe (per-image torchvision transforms in 2 workers, Adam, a loop)
  ceiling  : python -m benchmarks.plain_recipe --in-memory --channels-last (the same network and step, in the
             template's default NHWC layout, on tensors in memory)

The three run in turn, `--repeats` times (interleaved, so a burst of load elsewhere hits all of them alike;
the order rotates from one repeat to the next).
For each process: its wall time from the command to its exit, when its first training step began (counted
from the process's own start: interpreter, imports, set-up), and its images/s after `--warmup` steps. The
summary gives medians and the ratio of wall times, plain / template, pair by pair.

    python -m benchmarks.fit_vs_plain --root /tmp/cifar10/train --steps 800 --repeats 5
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import emit, machine, warm_bytecode

ROOT = Path(__file__).resolve().parent.parent


def commands(args: argparse.Namespace, logs: Path) -> dict[str, list[str]]:
    template = [
        sys.executable, "-m", "project", "fit", "--config", "configs/folder.yaml", "--data.root", str(args.root),
        "--data.image_size", "32", "--model.net", "SimpleCNN", "--data.batch_size", str(args.batch_size),
        "--trainer.max_steps", str(args.steps), "--trainer.limit_val_batches", "0",
        "--trainer.default_root_dir", str(logs),
    ]  # fmt: skip
    clock = ["--trainer.callbacks+=benchmarks.clock.FitClock", "--trainer.callbacks.warmup", str(args.warmup)]
    plain = [
        sys.executable,
        "-m",
        "benchmarks.plain_recipe",
        "--root",
        str(args.root),
        "--steps",
        str(args.steps),
    ]
    plain += ["--batch-size", str(args.batch_size), "--warmup", str(args.warmup)]
    ceiling = [*plain, "--in-memory", "--channels-last"]  # the template's step: NHWC by default
    return {"template": [*template, *clock], "plain": plain, "ceiling": ceiling}


def run(command: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{command[2:4]} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("CLOCK "))
    return {**json.loads(line.removeprefix("CLOCK ")), "wall_s": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    emit(
        benchmark="fit_vs_plain",
        **machine(),
        root=str(args.root),
        steps=args.steps,
        batch_size=args.batch_size,
    )
    with tempfile.TemporaryDirectory() as logs:
        cmds = commands(args, Path(logs))
        # The image cache and the bytecode, built (or checked) once, untimed: every later run finds them warm.
        warm_bytecode()
        warm = subprocess.run(
            [*cmds["template"], "--trainer.max_steps", "1"], cwd=ROOT, capture_output=True, text=True
        )
        if warm.returncode != 0:
            raise SystemExit(warm.stderr[-3000:])
        rows: dict[str, list[dict]] = {name: [] for name in cmds}
        names = list(cmds)
        for repeat in range(args.repeats):
            # The order rotates: on a shared VM a process runs slower after a busy one (the plain recipe keeps
            # three processes busy), and a fixed order would hand that to the same variant every time.
            for name in names[repeat % 3 :] + names[: repeat % 3]:
                rows[name].append(run(cmds[name]))
                emit(repeat=repeat, **rows[name][-1])
    summary = {
        name: {
            key: statistics.median(r[key] for r in runs) for key in ("wall_s", "first_step_s", "images_per_s")
        }
        for name, runs in rows.items()
    }
    ratios = [p["wall_s"] / t["wall_s"] for p, t in zip(rows["plain"], rows["template"], strict=True)]
    steady = [
        t["images_per_s"] / c["images_per_s"] for t, c in zip(rows["template"], rows["ceiling"], strict=True)
    ]
    emit(summary=summary, wall_ratio_plain_over_template=ratios, template_over_ceiling=steady)
    print(f"steady state template / ceiling: {statistics.median(steady):.2f}")
    print(f"ratio: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
