"""What the QAT callback reports at the end of fit: float, fake-quantized and INT8 accuracy, and the metadata
saved inside the INT8 program."""

import importlib.metadata
import math
from collections.abc import Sequence
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.trainer.states import RunningStage
from torch import nn
from torch.fx import GraphModule
from torchmetrics.classification import MulticlassAccuracy

from project.compression import pt2e


@torch.no_grad()
def evaluate_int8(
    trainer: L.Trainer, pl_module: L.LightningModule, prepared: GraphModule, int8: nn.Module
) -> dict[str, float]:
    """Top-1 accuracy of the float, fake-quantized and INT8 models on the validation set (as limited by
    trainer.limit_val_batches), and how often INT8 and fake-quantized predictions agree."""
    # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
    datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
    loader = datamodule.val_dataloader() if datamodule is not None else trainer.val_dataloaders
    if loader is None or isinstance(loader, list | tuple | dict):
        return {}
    limit = trainer.limit_val_batches
    batches = len(loader)
    batches = min(batches, int(limit)) if isinstance(limit, int) else max(1, math.floor(batches * limit))
    floating = pt2e.without_fake_quant(prepared)
    mode = prepared.training
    prepared.eval()
    stage = trainer.state.stage
    trainer.state.stage = RunningStage.VALIDATING  # the DataModule normalises without augmenting
    # The same definition as the module's val/acc: the fraction of images classified correctly.
    # nn.Module types attribute look-ups as Tensor | Module; class_names is the classifier's list of names.
    class_names = cast("Sequence[str]", pl_module.class_names)
    num_classes = int(getattr(pl_module.hparams, "num_classes", 0) or len(class_names))
    accuracy = {
        k: MulticlassAccuracy(num_classes, average="micro").to(pl_module.device)
        for k in ("float", "fake_quant", "int8")
    }
    agree = total = 0
    try:
        for i, batch in enumerate(loader):
            if i >= batches:
                break
            x, y = trainer.strategy.batch_to_device(batch)
            logits = prepared(x)
            fake_quant = logits.argmax(1)
            quantized = int8(x.cpu()).argmax(1).to(y.device)
            accuracy["float"].update(floating(x).argmax(1), y)
            accuracy["fake_quant"].update(fake_quant, y)
            accuracy["int8"].update(quantized, y)
            agree += int((quantized == fake_quant).sum())
            total += y.numel()
    finally:
        trainer.state.stage = stage
        prepared.train(mode)
    if not total:
        return {}
    report = {f"val_acc_{k}": float(metric.compute()) for k, metric in accuracy.items()}
    return {**report, "int8_agreement": agree / total}


def int8_metadata(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    example_shape: tuple[int, ...],
    backend: str,
    report: dict[str, float],
) -> dict[str, Any]:
    """What travels inside the INT8 program: input facts, class names, normalisation, accuracies, versions."""
    # Trainer.datamodule is set by Lightning's data connector, outside the class: pyright cannot see it.
    datamodule = trainer.datamodule  # pyright: ignore[reportAttributeAccessIssue]
    versions = {}
    for package in ("torch", "torchao"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "format": "torch.export program, INT8 (quantize/dequantize ops), x86",
        "input": "normalized float32 (N, C, H, W): (image / 255 - mean) / std",
        "backend": backend,
        "input_shape": list(example_shape),
        "class_names": list(getattr(pl_module, "class_names", []) or []),
        "mean": list(getattr(datamodule, "mean", []) or []),
        "std": list(getattr(datamodule, "std", []) or []),
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        **report,
        **versions,
    }
