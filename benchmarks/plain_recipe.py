"""The plain PyTorch recipe as a whole process: SimpleCNN, Adam (lr 1e-3), batch 64, per-image
RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize in 2 DataLoader workers, and a
hand-written loop. With `--in-memory`, the compute-only ceiling: the same network, optimizer and batch on
tensors already in memory, without a loader; `--channels-last` gives it the template's default memory layout
(NHWC weights and inputs), so that it stays the ceiling of the template's own step.

    python -m benchmarks.plain_recipe --root /tmp/cifar10/train --steps 800
    python -m benchmarks.plain_recipe --root /tmp/cifar10/train --steps 800 --in-memory
"""

import argparse
import itertools
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import plain_loader
from benchmarks.step_clock import StepClock


def seed_article_cnn(num_classes: int = 10) -> nn.Module:
    """The network, written as introductory tutorials write it (project.models.SimpleCNN is the same)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, num_classes),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root", type=Path, required=True, help="class folders of images (32x32 CIFAR JPEGs)"
    )
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=100, help="steps before the steady-state rate is timed")
    parser.add_argument("--in-memory", action="store_true", help="the compute-only ceiling: no loader")
    parser.add_argument("--channels-last", action="store_true", help="NHWC weights and inputs")
    args = parser.parse_args()

    torch.manual_seed(0)
    net = seed_article_cnn()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    if args.in_memory:
        batches = [
            (torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,)))
            for _ in range(8)
        ]
        source = itertools.cycle(batches)
    else:
        loader = plain_loader(args.root, args.batch_size, num_workers=args.workers)
        source = (batch for _ in itertools.count() for batch in loader)
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    clock = StepClock(args.warmup)
    net.train()
    for _, (x, y) in zip(range(args.steps), source, strict=False):
        clock.step(len(x))
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        optimizer.step()
    clock.report(variant="ceiling" if args.in_memory else "plain")


if __name__ == "__main__":
    main()
