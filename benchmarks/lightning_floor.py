"""The plain recipe run by Lightning, as the floor of any template built on it: the same network, optimizer,
loader and step as benchmarks.plain_recipe, in a LightningModule and a LightningDataModule, trained by

  --runner trainer : `Trainer(...).fit(...)` from a script (Lightning's imports and its fit set-up)
  --runner cli     : `LightningCLI(...)` with the same classes and settings given as flags (jsonargparse's
                     parse and instantiation on top)

Both with Lightning's extras off (no logger, checkpoint, progress bar or model summary), so that what they
add to the plain recipe's start-up is what Lightning itself costs; what the template adds beyond `--runner
cli` is its own.

    python -m benchmarks.lightning_floor --runner cli --root /tmp/cifar60k --steps 20
"""

import argparse
from pathlib import Path

import lightning as L
import torch
from torch import nn

from benchmarks.clock import FitClock
from benchmarks.common import plain_loader
from benchmarks.plain_recipe import seed_article_cnn

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class PlainRecipe(L.LightningModule):
    """benchmarks.plain_recipe's step: SimpleCNN, cross-entropy, Adam."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = seed_article_cnn()
        self.loss = nn.CrossEntropyLoss()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class PlainFolder(L.LightningDataModule):
    """benchmarks.plain_recipe's loader: per-image transforms of a JPEG folder in 2 workers."""

    def __init__(self, root: Path, batch_size: int = 64, num_workers: int = 2) -> None:
        super().__init__()
        self.root, self.batch_size, self.num_workers = root, batch_size, num_workers

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return plain_loader(self.root, self.batch_size, num_workers=self.num_workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runner", choices=["trainer", "cli"], required=True)
    parser.add_argument(
        "--root", type=Path, required=True, help="class folders of images (32x32 CIFAR JPEGs)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="steps before the steady-state rate is timed")
    args = parser.parse_args()
    torch.manual_seed(0)
    variant = f"lightning {args.runner}"
    if args.runner == "trainer":
        clock = FitClock(args.warmup, variant)
        trainer = L.Trainer(max_steps=args.steps, callbacks=[clock], **QUIET)  # type: ignore[arg-type]
        trainer.fit(PlainRecipe(), PlainFolder(args.root))
        return
    from lightning.pytorch.cli import LightningCLI

    LightningCLI(
        PlainRecipe,
        PlainFolder,
        trainer_defaults=QUIET,
        save_config_callback=None,
        args=[
            "fit", "--data.root", str(args.root), "--trainer.max_steps", str(args.steps),
            "--trainer.callbacks+=benchmarks.clock.FitClock", "--trainer.callbacks.warmup", str(args.warmup),
            "--trainer.callbacks.variant", variant,
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
