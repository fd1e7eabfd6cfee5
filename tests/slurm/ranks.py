"""Start `python -m project fit` as the processes of a SLURM job step, without SLURM: what `srun -n 2` on
one node sets for each task, a stand-in `scontrol` that records its arguments, and a way to signal one rank.
"""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import PACKAGE, ROOT, subprocess_env

JOB_ID = "4242"


def fake_scontrol(bin_dir: Path, record: Path) -> Path:
    """A `scontrol` that appends its arguments as one line to `record` (what a requeue would have run)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    script.chmod(0o755)
    return bin_dir


@dataclass
class Step:
    """The processes of one job step, rank by rank, with their logs."""

    procs: list[subprocess.Popen]
    logs: list[Path]

    def wait(self, timeout: float) -> list[int | None]:
        """Exit codes, or None for each process still running after `timeout` seconds in all (then killed)."""
        end = time.monotonic() + timeout
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, end - time.monotonic()))
        codes = [proc.poll() for proc in self.procs]
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return codes

    def output(self) -> str:
        return "\n".join(f"--- rank {r}\n{log.read_text()[-3000:]}" for r, log in enumerate(self.logs))


def start_step(args: list[str], ntasks: int, port: int, folder: Path, bin_dir: Path) -> Step:
    """`python -m project <args>` as `ntasks` tasks of SLURM job JOB_ID on this machine (like `srun -n`)."""
    procs, logs = [], []
    for rank in range(ntasks):
        env = {
            **subprocess_env(),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_JOB_ID": JOB_ID,
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(ntasks),
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NNODES": "1",
            "SLURM_NODELIST": "127.0.0.1",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        log = folder / f"rank{rank}.log"
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", PACKAGE, *args],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        logs.append(log)
    return Step(procs, logs)


def signal_after_step(
    step: Step,
    probe_dir: Path,
    rank: int,
    after: int,
    rng: random.Random,
    timeout: float,
    signum: int = signal.SIGUSR1,
) -> int:
    """Send `signum` to `rank` once rank 0 has finished optimizer step `after`, a random few milliseconds
    later (so it lands anywhere in a step: forward, backward, the gradient all-reduce, the optimizer).
    Returns the step rank 0 had reached when it was sent."""
    progress = probe_dir / "rank0.step"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(p.poll() is not None for p in step.procs):
            raise AssertionError(f"a process ended before step {after}\n{step.output()}")
        text = progress.read_text() if progress.exists() else ""
        if text and int(text) >= after:
            time.sleep(rng.uniform(0, 0.03))
            os.kill(step.procs[rank].pid, signum)
            return int(text)
        time.sleep(0.002)
    raise AssertionError(f"step {after} not reached in {timeout}s\n{step.output()}")
