"""Data-loader memory over a long run: does it grow with several persistent workers? (RSS/PSS per epoch)

A tiny MLP trains for many epochs on a generated folder of JPEGs decoded per image in the loader workers
(`data.cache: false`, the path where the dataset object, with its Python list of file paths, lives in
every worker: the classic source of copy-on-read growth) with `persistent_workers: true`. After each
training epoch it records the main process's RSS, the workers' RSS, USS and PSS (psutil; PSS counts shared
pages once, so main + workers PSS is the real total), /dev/shm use and open file descriptors. Run it once
per tensor sharing strategy; the summary line gives the growth from the second epoch to the last and the
slope over the second half.

    python -m benchmarks.loader_memory --epochs 40 --workers 2 --sharing-strategy file_descriptor
    python -m benchmarks.loader_memory --epochs 40 --workers 2 --sharing-strategy file_system
"""

import argparse
import csv
import os
import shutil
import tempfile
from pathlib import Path

import lightning as L
import psutil
import torch

from benchmarks.common import emit, machine
from project.data import ImageFolderDataModule
from project.models import MLP
from project.tasks import ImageClassifier
from tests.fakes import make_image_folder

MB = 1024**2


def snapshot() -> dict:
    """Memory of this process and its children (the loader workers), in MB."""
    main = psutil.Process()
    workers = main.children(recursive=True)
    info = [w.memory_full_info() for w in workers]
    main_info = main.memory_full_info()
    return {
        "workers": len(workers),
        "main_rss_mb": main_info.rss / MB,
        "workers_rss_mb": sum(i.rss for i in info) / MB,
        "workers_uss_mb": sum(i.uss for i in info) / MB,
        "total_pss_mb": (main_info.pss + sum(i.pss for i in info)) / MB,
        "shm_used_mb": shutil.disk_usage("/dev/shm").used / MB if os.path.isdir("/dev/shm") else float("nan"),
        "open_fds": main.num_fds() + sum(w.num_fds() for w in workers),
    }


class MemoryPerEpoch(L.Callback):
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        row = {"epoch": trainer.current_epoch, **snapshot()}
        self.rows.append(row)
        emit(**{k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--images-per-class", type=int, default=200, help="10 classes of generated JPEG/PNG files"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--sharing-strategy", choices=["file_descriptor", "file_system"], default="file_descriptor"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.multiprocessing.set_sharing_strategy(args.sharing_strategy)
    emit(benchmark="loader_memory", **machine(), **{k: str(v) for k, v in vars(args).items()})

    with tempfile.TemporaryDirectory() as tmp:
        root = make_image_folder(
            Path(tmp) / "images", classes=10, per_class=args.images_per_class, extras=False
        )
        data = ImageFolderDataModule(
            root=str(root),
            image_size=32,
            cache=False,  # decode per image in the workers, every epoch
            cache_dir=str(Path(tmp) / "cache"),
            batch_size=args.batch_size,
            num_workers=args.workers,
            persistent_workers=True,
        )
        model = ImageClassifier(MLP(num_classes=10, hidden=64), num_classes=10, input_shape=None)
        probe = MemoryPerEpoch()
        trainer = L.Trainer(
            accelerator="cpu",
            max_epochs=args.epochs,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[probe],
        )
        trainer.fit(model, datamodule=data)

    rows = probe.rows
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"loader_memory_{args.sharing_strategy}.csv"
    with open(path, "w", newline="") as f:
        # Committed to the repository: LF line endings, as the hygiene hooks require.
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    steady = rows[1:]  # epoch 0 includes start-up allocations
    half = steady[len(steady) // 2 :]
    emit(
        summary="loader_memory",
        sharing_strategy=args.sharing_strategy,
        epochs=len(rows),
        total_pss_mb_epoch1=round(steady[0]["total_pss_mb"], 1),
        total_pss_mb_last=round(steady[-1]["total_pss_mb"], 1),
        total_pss_growth_mb=round(steady[-1]["total_pss_mb"] - steady[0]["total_pss_mb"], 1),
        workers_uss_growth_mb=round(steady[-1]["workers_uss_mb"] - steady[0]["workers_uss_mb"], 1),
        main_rss_growth_mb=round(steady[-1]["main_rss_mb"] - steady[0]["main_rss_mb"], 1),
        pss_slope_mb_per_epoch_second_half=round(
            slope([r["epoch"] for r in half], [r["total_pss_mb"] for r in half]), 3
        ),
        shm_max_mb=round(max(r["shm_used_mb"] for r in rows), 1),
        open_fds_first_last=[rows[0]["open_fds"], rows[-1]["open_fds"]],
        csv=str(path),
    )


if __name__ == "__main__":
    main()
