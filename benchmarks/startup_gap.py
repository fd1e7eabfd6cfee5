"""Start-up gap: how much later than the plain PyTorch recipe the template's first training step comes.

Both as whole processes from the command (benchmarks.fit_vs_plain's commands: SimpleCNN, batch 64, the JPEG
folder at 32 px, the template with all its defaults and a warm image cache), the first step counted from the
process's own start (benchmarks.clock.FitClock). With `--before DIR`, a second checkout of the template (e.g.
`git worktree add /tmp/before <commit>`) runs in the same rotation, so a change's effect on start-up is measured
side by side on the same machine state. With `--floor`, the plain recipe run by Lightning's Trainer and by a
bare LightningCLI (benchmarks.lightning_floor) joins the rotation: what Lightning itself adds, which no template
built on it can save. With `--with-path DIR`, the template also runs with DIR on PYTHONPATH, to measure what an
optional package costs where it is installed (`pip install --target DIR matplotlib`). Medians of `--repeats`
interleaved rounds.

    python -m benchmarks.startup_gap --root /tmp/cifar60k --before /tmp/before --repeats 7
    python -m benchmarks.startup_gap --root /tmp/cifar60k --floor --repeats 7
    python -m benchmarks.startup_gap --root /tmp/cifar60k --floor --with-path /tmp/matplotlib --repeats 9
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
from benchmarks.fit_vs_plain import ROOT, commands


def first_step(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{command[2:4]} in {cwd} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("CLOCK "))
    return json.loads(line.removeprefix("CLOCK "))["first_step_s"] or time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="class folders of JPEGs")
    parser.add_argument(
        "--before", type=Path, help="another checkout of the template, run in the same rotation"
    )
    parser.add_argument(
        "--floor", action="store_true", help="also the plain recipe in Trainer and LightningCLI"
    )
    parser.add_argument(
        "--with-path",
        type=Path,
        help="also the template with this folder on PYTHONPATH (a package added with pip install --target)",
    )
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    emit(benchmark="startup_gap", **machine(), root=str(args.root), before=str(args.before), floor=args.floor)
    with tempfile.TemporaryDirectory() as logs:
        cmds = commands(argparse.Namespace(root=args.root, steps=20, batch_size=64, warmup=5), Path(logs))
        runs = {"template": (cmds["template"], ROOT), "plain": (cmds["plain"], ROOT)}
        if args.before:
            runs["template before"] = (cmds["template"], args.before.resolve())
        if args.with_path:
            added = ["env", f"PYTHONPATH={args.with_path.resolve()}", *cmds["template"]]
            runs[f"template with {args.with_path.name}"] = (added, ROOT)
        if args.floor:
            floor = [
                sys.executable,
                "-m",
                "benchmarks.lightning_floor",
                "--root",
                str(args.root),
                "--steps",
                "20",
            ]
            runs["lightning trainer"] = ([*floor, "--runner", "trainer"], ROOT)
            runs["lightning cli"] = ([*floor, "--runner", "cli"], ROOT)
        warm_bytecode()
        if args.before:  # its bytecode written too, as a user's second run would find it
            import compileall

            for folder in ("project", "benchmarks"):
                compileall.compile_dir(args.before / folder, quiet=1)
        for command, cwd in runs.values():  # every cache warm (images, bytecode, page cache), untimed
            first_step(command, cwd)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for repeat in range(args.repeats):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                times[name].append(first_step(*runs[name]))
                emit(repeat=repeat, run=name, first_step_s=times[name][-1])
    medians = {name: statistics.median(t) for name, t in times.items()}
    gaps = {name: round(m - medians["plain"], 2) for name, m in medians.items() if name != "plain"}
    emit(summary=medians, gap_to_plain_s=gaps)
    for name, m in medians.items():
        print(f"{name}: first step after {m:.2f} s (min {min(times[name]):.2f}, max {max(times[name]):.2f})")
    print(f"gap to the plain recipe: {gaps}")


if __name__ == "__main__":
    main()
