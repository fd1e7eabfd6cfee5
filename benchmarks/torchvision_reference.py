"""torchvision's reference data path for image classification, as a whole process: the same network, optimizer
and schedule as configs/folder.yaml, fed the way torchvision's references/classification/train.py feeds it.

Training: `ImageFolder` + per-sample `RandomResizedCrop(size, scale)` and `RandomHorizontalFlip` from the
original JPEGs, `PILToTensor` + `ToDtype` + `Normalize` (their `ClassificationPresetTrain`); evaluation:
`Resize(size / 0.875)` + `CenterCrop(size)` (their `ClassificationPresetEval`, crop ratio 0.875). DataLoader
with `--workers` processes, shuffled, `drop_last=False`; the loop validates every epoch as their `evaluate` does
and tests the final weights on `root/test`. torchvision ResNet-18 (random init, NHWC like the template's step),
AdamW (lr and weight decay as folder.yaml, no decay on norms and biases as the template does), OneCycleLR
stepped per batch, cross-entropy with label smoothing 0.1. Prints one JSON line: test accuracy and wall time.

    python -m benchmarks.torchvision_reference --root /tmp/clothing --size 64 --epochs 10
"""

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from benchmarks.step_clock import process_age


def presets(size: int, scale: tuple[float, float], mean: list[float], std: list[float]) -> tuple:
    normalize = [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    train = v2.Compose(
        [v2.RandomResizedCrop(size, scale=scale, antialias=True), v2.RandomHorizontalFlip(), *normalize]
    )
    evaluate = v2.Compose([v2.Resize(int(size / 0.875), antialias=True), v2.CenterCrop(size), *normalize])
    return train, evaluate


@torch.no_grad()
def accuracy(net: nn.Module, loader: DataLoader) -> float:
    net.eval()
    correct = total = 0
    for x, y in loader:
        correct += int((net(x.contiguous(memory_format=torch.channels_last)).argmax(1) == y).sum())
        total += len(y)
    net.train()
    return correct / total


def ceiling(
    net: nn.Module, optimizer, scheduler, loss_fn: nn.Module, steps: int, args: argparse.Namespace
) -> None:
    """The training steps alone, on 8 batches of random tensors cycled: what no data path can beat."""
    shape = (args.batch_size, 3, args.size, args.size)
    batches = [(torch.randn(shape), torch.randint(0, 10, (args.batch_size,))) for _ in range(8)]
    start = time.perf_counter()
    for _, (x, y) in zip(range(steps), itertools.cycle(batches), strict=False):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(net(x.contiguous(memory_format=torch.channels_last)), y).backward()
        optimizer.step()
        scheduler.step()
    record = {"variant": "ceiling", "epochs": args.epochs, "size": args.size, "steps": steps}
    print("RESULT " + json.dumps({**record, "train_s": round(time.perf_counter() - start, 2)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, required=True, help="root/train, root/val, root/test class folders"
    )
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument(
        "--scale", type=float, nargs=2, default=(0.25, 1.0), help="RandomResizedCrop's area range"
    )
    parser.add_argument(
        "--in-memory",
        action="store_true",
        help="the compute ceiling: the same training steps on tensors in memory",
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    # ImageNet's statistics, as the references use for every dataset.
    train_tf, eval_tf = presets(args.size, tuple(args.scale), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    folders = {
        split: torchvision.datasets.ImageFolder(str(args.root / split)) for split in ("train", "val", "test")
    }
    folders["train"].transform = train_tf
    folders["val"].transform = folders["test"].transform = eval_tf

    def loader(split: str) -> DataLoader:
        return DataLoader(
            folders[split], batch_size=args.batch_size, shuffle=split == "train", num_workers=args.workers,
            persistent_workers=args.workers > 0,
        )  # fmt: skip

    loaders = {split: loader(split) for split in folders}
    net = torchvision.models.resnet18(num_classes=len(folders["train"].classes)).to(
        memory_format=torch.channels_last
    )
    decay = [p for p in net.parameters() if p.ndim > 1]
    no_decay = [p for p in net.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
    )
    steps = args.epochs * math.ceil(len(folders["train"]) / args.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=steps, pct_start=0.2
    )
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    if args.in_memory:
        ceiling(net, optimizer, scheduler, loss_fn, steps, args)
        return
    first_step_s = None
    for epoch in range(args.epochs):
        for x, y in loaders["train"]:
            first_step_s = first_step_s or process_age()
            optimizer.zero_grad(set_to_none=True)
            loss_fn(net(x.contiguous(memory_format=torch.channels_last)), y).backward()
            optimizer.step()
            scheduler.step()
        val_acc = accuracy(net, loaders["val"])
        print(f"epoch {epoch} val/acc {val_acc:.4f}", flush=True)
    record = {
        "variant": "torchvision_reference", "epochs": args.epochs, "size": args.size, "val_acc": round(val_acc, 4),
        "test_acc": round(accuracy(net, loaders["test"]), 4), "first_step_s": round(first_step_s or 0.0, 2),
        "train_end_s": round(process_age(), 2),
    }  # fmt: skip
    print("RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
