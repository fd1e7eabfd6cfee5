"""Shared pieces of the benchmarks: the plain per-sample pipeline they are compared with, and reporting."""

import json
import platform
import time
from pathlib import Path

import torch
import torchvision
from torchvision import transforms

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def plain_loader(
    root: Path, batch_size: int, num_workers: int = 2, indices: list[int] | None = None, train: bool = True
):
    """The recipe users write first: per-sample PIL transforms in DataLoader workers."""
    ops = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()] if train else []
    tf = transforms.Compose([*ops, transforms.ToTensor(), transforms.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    dataset = torchvision.datasets.ImageFolder(str(root), transform=tf)
    if indices is not None:
        dataset = torch.utils.data.Subset(dataset, indices)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=train, drop_last=train, num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )  # fmt: skip


def warm_bytecode() -> None:
    """Write the bytecode cache of `project/` and `benchmarks/`, as a user's second run finds it. pip compiled
    site-packages at install; the editable project is compiled by its first import, unless the environment
    sets PYTHONDONTWRITEBYTECODE (this VM does), and then every timed run would compile it again."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in ("project", "benchmarks"):
        compileall.compile_dir(root / folder, quiet=1)


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": len(__import__("os").sched_getaffinity(0)),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "threads": torch.get_num_threads(),
    }


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


class Stopwatch:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def build_cli(args: list[str]):
    """`build(args)` from inside a benchmark: the benchmark's own command line is hidden
    from it (LightningCLI warns when it is given both `args` and a command line)."""
    import sys

    from project.cli import build

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        return build(args)
    finally:
        sys.argv = argv
