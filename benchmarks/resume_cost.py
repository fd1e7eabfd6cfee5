"""What exact resume costs: the bytes it adds to a checkpoint (every process's RNG states, the loader's position),
with 1 and 2 processes, and the per-batch cost of the resumable training loader against a plain shuffled one.

The checkpoints come from a 5-step SimpleCNN fit on a fake CIFAR-10 (tests.fakes), each re-saved without what
exact resume adds (rank 0's RNG states only, no loader position) to count the difference.

    python -m benchmarks.resume_cost --out /tmp/resume_cost
"""

import argparse
import copy
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from benchmarks.common import emit, machine
from benchmarks.fit_vs_plain import ROOT


def checkpoint_bytes(out: Path, data: Path, *extra: str) -> dict:
    args = ["fit", "--config", "configs/cifar10.yaml", "--model.net", "project.models.SimpleCNN"]
    args += ["--data.data_dir", str(data), "--data.download", "false", "--data.val_size", "100"]
    args += ["--data.batch_size", "25", "--trainer.precision", "32-true", "--trainer.max_steps", "5"]
    args += ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    args += ["--trainer.default_root_dir", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "patched_main.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    (last,) = out.glob("runs/version_0/checkpoints/last.ckpt")
    ckpt = torch.load(last, weights_only=True)
    without = copy.deepcopy(ckpt)
    without["callbacks"]["RNGState"] = ckpt["callbacks"]["RNGState"]["ranks"][0]
    without["loops"]["fit_loop"]["state_dict"].pop("combined_loader")

    def size(c: dict) -> int:
        buffer = io.BytesIO()
        torch.save(c, buffer)
        return len(buffer.getvalue())

    ranks = len(ckpt["callbacks"]["RNGState"]["ranks"])
    return {"processes": ranks, "checkpoint_bytes": size(ckpt), "extra_bytes": size(ckpt) - size(without)}


def loader_cost(repeats: int = 2, epochs: int = 5) -> list[dict]:
    from project.data.samplers import ResumableLoader, ResumableSampler
    from project.data.tensor_dataset import TensorImageDataset, collate_pre_batched

    images = torch.randint(0, 256, (50_000, 3, 32, 32), dtype=torch.uint8)
    ds = TensorImageDataset(images, torch.randint(0, 10, (50_000,)))
    kw = dict(batch_size=256, drop_last=True, collate_fn=collate_pre_batched)

    def per_batch(loader: DataLoader) -> float:
        best = float("inf")
        for epoch in range(epochs):
            if hasattr(loader.sampler, "set_epoch"):
                loader.sampler.set_epoch(epoch)  # pyright: ignore[reportAttributeAccessIssue]
            start = time.perf_counter()
            n = sum(1 for _ in loader)
            best = min(best, (time.perf_counter() - start) / n)
        return best

    plain = DataLoader(ds, shuffle=True, **kw)
    generator = torch.Generator().manual_seed(0)
    resumable = ResumableLoader(ds, ResumableSampler(ds, seed=0), generator=generator, **kw)
    rows = []
    for _ in range(repeats):
        a, b = per_batch(plain), per_batch(resumable)
        rows.append(
            {
                "plain_us": round(a * 1e6),
                "resumable_us": round(b * 1e6),
                "difference_us": round((b - a) * 1e6),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.fakes import make_fake_cifar

    emit(benchmark="resume_cost", **machine())
    data = make_fake_cifar(args.out / "cifar")
    emit(**checkpoint_bytes(args.out / "one", data))
    emit(**checkpoint_bytes(args.out / "two", data, "--config", "configs/trainer/ddp_cpu.yaml"))
    for row in loader_cost():
        emit(**row)


if __name__ == "__main__":
    main()
