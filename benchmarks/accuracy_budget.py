"""Accuracy for a fixed compute budget on the CPU: the template vs the plain loop, same epochs.

SimpleCNN, SGD (lr 0.05, momentum 0.9, weight decay 5e-4), batch 128, `--epochs` epochs on the CIFAR-10 JPEG
training images, validated on a held-out, stratified 10% split (the same 5,000 images for both). The template
runs `python -m project fit` (configs/folder.yaml, in this process); the plain loop uses the per-sample
torchvision pipeline. Reports validation accuracy and wall time of each.

    python -m benchmarks.accuracy_budget --root /tmp/cifar10/train --epochs 3
"""

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

from benchmarks.common import build_cli, emit, machine, plain_loader
from project.data.decoded_cache import default_cache_dir
from project.models import SimpleCNN


def template(args, cache_dir: Path) -> tuple[float, float, list[int], list[int], list[Path]]:
    cli = build_cli(
        [
            "--config", "configs/folder.yaml", "--data.root", str(args.root), "--data.image_size", "32",
            "--data.batch_size", "128", "--data.cache_dir", str(cache_dir), "--data.val_fraction", "0.1",
            "--model.net", "SimpleCNN", "--model.scheduler", "null", "--model.label_smoothing", "0",
            "--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.05", "--model.optimizer.momentum", "0.9",
            "--model.optimizer.weight_decay", "5e-4", "--model.weight_decay_norm_and_bias", "true",
            "--trainer.max_epochs", str(args.epochs), "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.accelerator", "cpu",
            "--trainer.num_sanity_val_steps", "0",
        ],
    )  # fmt: skip
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    seconds = time.perf_counter() - start
    acc = float(cli.trainer.callback_metrics["val/acc"])
    dm = cli.datamodule
    return acc, seconds, dm.train_set.indices.tolist(), dm.val_set.indices.tolist(), dm.train_files


def plain(args, train_idx: list[int], val_idx: list[int]) -> tuple[float, float]:
    torch.manual_seed(0)
    net = SimpleCNN(num_classes=10)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    train = plain_loader(args.root, 128, num_workers=2, indices=train_idx)
    val = plain_loader(args.root, 256, num_workers=2, indices=val_idx, train=False)
    start = time.perf_counter()
    for _ in range(args.epochs):
        net.train()
        for x, y in train:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in val:
            correct += (net(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total, seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    emit(benchmark="accuracy_budget", **machine(), net="SimpleCNN", epochs=args.epochs)
    cache_dir = default_cache_dir()  # keyed by the files: built once, reused by every benchmark
    acc_t, sec_t, train_idx, val_idx, files = template(args, cache_dir)
    emit(variant="python -m project fit", val_acc=round(acc_t, 4), train_seconds=round(sec_t, 1))
    # The plain pipeline must see the very same split: ImageFolder lists files in the same sorted order.
    samples = [Path(p) for p, _ in torchvision.datasets.ImageFolder(str(args.root)).samples]
    assert samples == [Path(f) for f in files], "file order differs between ImageFolder and the DataModule"
    acc_p, sec_p = plain(args, train_idx, val_idx)
    emit(
        variant="plain loop + per-sample torchvision (2 workers)",
        val_acc=round(acc_p, 4),
        train_seconds=round(sec_p, 1),
    )
    emit(
        summary=True,
        accuracy_difference_points=round(100 * (acc_t - acc_p), 2),
        speedup=round(sec_p / sec_t, 2),
    )
    print(f"ratio: {sec_p / sec_t:.2f}")


if __name__ == "__main__":
    main()
