"""Exact resume at many random moments: every shipped config (shrunk to tiny data and network, its scheduler,
precision, augmentation, EMA and loader workers as shipped) run once uninterrupted, then again and again stopped
by SIGTERM from outside at random moments (inside a training step, a validation, a checkpoint write; to a random
rank under DDP), each stop resumed with `--ckpt_path last`, and the end compared with the uninterrupted run's:
weights, optimizer, schedule, every callback's state (EMA, Lookahead, the random generators), step and epoch.
The run waits for each signal at the event after the moment's (tests/resume_moments.py), so every moment stops
it however loaded the machine is: `stops` should equal `moments_tried`.

Each chain is `--stops` moments of one resumed run, seeded (`--seed`, the chain's number) and logged; a line of
JSON per chain, then one per config with the moments tried, the stops that stopped the run and the chains that
ended bit-identical. Long: run it at low priority, alone or not (it measures no time).

    OMP_NUM_THREADS=1 nice -n 19 python -m benchmarks.resume_moments --out /tmp/resume_moments --chains 5
    OMP_NUM_THREADS=1 nice -n 19 python -m benchmarks.resume_moments --out /tmp/resume_moments --ddp --configs folder.yaml
"""

import argparse
import random
import shutil
from pathlib import Path

from benchmarks.common import emit, machine
from tests.resume_moments import choose_moments, make_tiny_data, shipped_configs, stopped_run, whole_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the data and the runs")
    parser.add_argument("--configs", nargs="*", help="configs under configs/ (default: every shipped one)")
    parser.add_argument("--chains", type=int, default=5, help="stopped runs per config")
    parser.add_argument("--stops", type=int, default=3, help="random moments per stopped run")
    parser.add_argument("--ddp", action="store_true", help="2-process DDP (configs/trainer/ddp_cpu.yaml)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shutil.rmtree(args.out / "data", ignore_errors=True)
    data = make_tiny_data(args.out / "data")
    emit(machine=machine())
    for config in args.configs or shipped_configs():
        base = args.out / ("ddp" if args.ddp else "one") / config.replace("/", "_")
        shutil.rmtree(base, ignore_errors=True)
        timeline = whole_run(config, data, base / "whole", args.ddp)
        tried = stopped = exact = 0
        for chain in range(args.chains):
            rng = random.Random(f"{args.seed}:{config}:{chain}:{args.ddp}")
            try:
                moments = choose_moments(timeline, args.stops, rng, ranks=2 if args.ddp else 1)
            except ValueError as e:  # a run too short for --stops moments (each must be one a stop follows)
                emit(config=config, ddp=args.ddp, chain=chain, error=str(e))
                break
            root = base / f"chain{chain}"
            segments, differences = stopped_run(config, data, root, moments, base / "whole", args.ddp)
            shutil.rmtree(root, ignore_errors=True)
            tried += len(segments)
            stopped += sum(s.stopped for s in segments)
            exact += not differences
            emit(
                config=config,
                ddp=args.ddp,
                chain=chain,
                moments=[str(s.moment) for s in segments],
                exits=[s.returncode for s in segments],
                exact=not differences,
                differences=differences[:10],
            )
        emit(
            config=config,
            ddp=args.ddp,
            moments_tried=tried,
            stops=stopped,
            exact_chains=exact,
            chains=args.chains,
        )


if __name__ == "__main__":
    main()
