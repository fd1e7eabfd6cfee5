"""Training throughput (images/s over the same steps, same model, same batch size, same optimizer).

  template : `python -m project fit` (the CLI in this process, so a timing callback can be attached) with
             configs/folder.yaml on the CIFAR JPEGs: cached uint8 data, batched augmentation.
  plain    : a hand-written loop (zero_grad / forward / loss / backward / step) fed by the per-sample
             torchvision pipeline (ImageFolder + RandomCrop + Flip + ToTensor + Normalize, 2 workers).
  plain+ours: the same hand-written loop fed by the template's data path: shows Lightning's own overhead.

  template, speed.yaml: the template with configs/callbacks/speed.yaml (its diagnostics at their cheapest):
             against plain+ours this is Lightning's own overhead; the default template's gap adds the cost of
             the default diagnostics (per-layer gradient norms, a non-finite check every step).
Each variant trains `--steps` steps; images/s is measured over the steps after `--warmup`. The variants run
in `--rounds` alternating rounds and each keeps its best round, so a moment of load elsewhere on the machine
does not decide a comparison.

    python -m benchmarks.train_throughput --root /tmp/cifar10/train --net SimpleCNN --steps 200
    python -m benchmarks.train_throughput --root /tmp/cifar10/train --net CIFARResNet --steps 30 --warmup 5
"""

import argparse
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from benchmarks.common import build_cli, emit, machine, plain_loader
from project.data import ImageFolderDataModule
from project.data.decoded_cache import default_cache_dir
from project.models import CIFARResNet, SimpleCNN

NETS = {"SimpleCNN": SimpleCNN, "CIFARResNet": CIFARResNet}


class StepTimer(L.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end, self.images = warmup, None, None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.start is not None:
            self.images += batch[0].shape[0]
            self.end = time.perf_counter()


def template(args, cache_dir: Path, channels_last: bool = False, extra: tuple[str, ...] = ()) -> float:
    cli = build_cli(
        [
            "--config", "configs/folder.yaml", "--data.root", str(args.root), "--data.image_size", "32",
            "--data.batch_size", str(args.batch_size), "--data.cache_dir", str(cache_dir),
            "--model.net", args.net, "--model.scheduler", "null", "--model.label_smoothing", "0",
            "--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.05", "--model.optimizer.momentum", "0.9",
            "--model.channels_last", str(channels_last).lower(),
            "--trainer.max_steps", str(args.steps), "--trainer.limit_val_batches", "0", "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--trainer.accelerator", "cpu", *extra,
        ],
    )  # fmt: skip
    timer = StepTimer(args.warmup)
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    return timer.images / (timer.end - timer.start)


def plain_loop(args, batches) -> float:
    """`batches` yields normalised, augmented (x, y); the textbook loop around it."""
    torch.manual_seed(0)
    net = NETS[args.net](num_classes=10)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net.train()
    images, start = 0, None
    for step, (x, y) in enumerate(batches):
        if step == args.warmup:
            start = time.perf_counter()
        if step >= args.warmup:
            images += x.shape[0]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        if step + 1 == args.steps:
            break
    return images / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--net", choices=list(NETS), default="SimpleCNN")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds; each variant keeps its best"
    )
    parser.add_argument(
        "--channels-last", action="store_true", help="also time the template with channels_last"
    )
    args = parser.parse_args()
    emit(
        benchmark="train_throughput",
        **machine(),
        net=args.net,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
    )

    cache_dir = default_cache_dir()  # keyed by the files: built once, reused by every benchmark
    dm = ImageFolderDataModule(
        root=str(args.root), image_size=32, batch_size=args.batch_size, cache_dir=str(cache_dir)
    )
    dm.setup("fit")  # builds the cache once, outside the timings

    def ours():
        while True:
            for batch in dm.train_dataloader():
                yield dm.transform_batch(batch, train=True)

    variants = {
        "plain": ("plain loop + per-sample torchvision (2 workers)",
                  lambda: plain_loop(args, plain_loader(args.root, args.batch_size, num_workers=2))),
        "template": ("python -m project fit", lambda: template(args, cache_dir)),
        "template_speed": ("python -m project fit --config configs/callbacks/speed.yaml",
                           lambda: template(args, cache_dir, extra=("--config", "configs/callbacks/speed.yaml"))),
        "plain+ours": ("plain loop + template data path", lambda: plain_loop(args, ours())),
    }  # fmt: skip
    if args.channels_last:
        variants["template_cl"] = (
            "python -m project fit, channels_last",
            lambda: template(args, cache_dir, channels_last=True),
        )
    results: dict[str, float] = {}
    for round_ in range(args.rounds):
        for key, (label, run) in variants.items():
            value = run()
            emit(round=round_, variant=label, images_per_s=round(value, 1))
            results[key] = max(results.get(key, 0.0), value)
    emit(
        summary=True,
        best_of_rounds=args.rounds,
        lightning_overhead_pct=round(100 * (1 - results["template_speed"] / results["plain+ours"]), 1),
        default_diagnostics_overhead_pct=round(100 * (1 - results["template"] / results["plain+ours"]), 1),
        **{k: round(v, 1) for k, v in results.items()},
    )
    print(f"ratio: {results['template'] / results['plain']:.2f}")


if __name__ == "__main__":
    main()
