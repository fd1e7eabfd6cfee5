"""The same images, labelled by class folders or by a CSV, train to the same accuracy.

From a `root/train/<class>/*` + `root/test/<class>/*` dataset (`python -m benchmarks.cifar_subset --test_per_class ...`),
writes `root/train.csv` and `root/test.csv` (path,label; rows in the order the folder scan lists the files) and
trains SimpleCNN at 32 pixels with the same seed and recipe three times, each evaluated on the same test images:

  folder            configs/folder.yaml --data.root root
  csv               configs/csv.yaml --data.csv root/train.csv --data.test_csv root/test.csv
  csv, shuffled     the rows in a seeded random order and without file extensions, in another folder
                    (--data.images root): the same images and labels, so a different validation split and
                    batch order: the accuracy differs by the run-to-run noise of a different split, no more.

    python -m benchmarks.cifar_subset --src /tmp/cifar10/train --dst /tmp/csvbench/sub --per_class 300
    python -m benchmarks.cifar_subset --src /tmp/csvbench/sub --dst /tmp/csvbench/ds --test_per_class 100
    python -m benchmarks.labels_from_csv --root /tmp/csvbench/ds --epochs 4
"""

import argparse
import csv
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import build_cli, emit, machine
from project.data.image_reading import list_images


def write_csv(path: Path, root: Path, files: list[Path], strip_extension: bool = False) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for file in files:
            relative = file.relative_to(root)
            writer.writerow([relative.with_suffix("") if strip_extension else relative, file.parent.name])


def train(data_args: list[str], epochs: int, cache_dir: Path) -> dict:
    cli = build_cli(
        [
            *data_args, "--data.image_size", "32", "--data.batch_size", "128", "--data.cache_dir", str(cache_dir),
            "--data.val_fraction", "0.1", "--model.net", "SimpleCNN", "--model.scheduler", "null",
            "--model.label_smoothing", "0", "--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.05",
            "--model.optimizer.momentum", "0.9", "--model.optimizer.weight_decay", "5e-4",
            "--trainer.max_epochs", str(epochs), "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.accelerator", "cpu", "--trainer.num_sanity_val_steps", "0",
        ],
    )  # fmt: skip
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    val_acc = float(cli.trainer.callback_metrics["val/acc"])
    test_acc = float(cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0]["test/acc"])
    dm = cli.datamodule
    return {
        "val_acc": round(val_acc, 4),
        "test_acc": round(test_acc, 4),
        "train_images": len(dm.train_set),
        "val_images": len(dm.val_set),
        "test_images": len(dm.test_set),
        "classes": dm.class_names,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--root", type=Path, required=True, help="root/train/<class>/* and root/test/<class>/*"
    )
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    root = args.root.resolve()
    train_files, test_files = list_images(root / "train"), list_images(root / "test")
    write_csv(root / "train.csv", root, train_files)
    write_csv(root / "test.csv", root, test_files)
    elsewhere = Path(tempfile.mkdtemp(prefix="labels_csv_"))
    shuffled = list(train_files)
    random.Random(0).shuffle(shuffled)
    write_csv(elsewhere / "train.csv", root, shuffled, strip_extension=True)
    emit(benchmark="labels_from_csv", **machine(), net="SimpleCNN", epochs=args.epochs, root=str(root))
    cache_dir = elsewhere / "cache"
    variants = {
        "folder": ["--config", "configs/folder.yaml", "--data.root", str(root)],
        "csv": ["--config", "configs/csv.yaml", "--data.csv", str(root / "train.csv"),
                "--data.test_csv", str(root / "test.csv")],
        "csv, shuffled rows, no extensions": [
            "--config", "configs/csv.yaml", "--data.csv", str(elsewhere / "train.csv"), "--data.images", str(root),
            "--data.test_csv", str(root / "test.csv")],
    }  # fmt: skip
    for name, data_args in variants.items():
        emit(variant=name, **train(data_args, args.epochs, cache_dir))


if __name__ == "__main__":
    main()
