"""airbench94 itself, on the same class-folder split as the speed-run measurement, to tell data from recipe.

The speed-run config reimplements airbench94 inside the template. When it lands below airbench's published 94.01%
on these JPEGs, the question is whether the template's version or the data is at fault. This script answers it by
running the reference: Keller Jordan's `legacy/airbench94.py` (MIT licence, github.com/KellerJordan/cifar10-airbench),
kept line for line where it trains (network, whitening, optimizer and its decoupled hyperparameters, schedule,
lookahead, alternating flips, reflect-padded crops, TTA), changed only where it must be to run here:

- fp32 on the CPU instead of fp16 on CUDA (no `.half()`, `.cuda()` or CUDA events; wall time by `perf_counter`);
- the data come from `ROOT/train/<class>/` and `ROOT/test/<class>/` (decoded once, at 32 px) instead of
  torchvision's CIFAR-10 download; the per-epoch test accuracy is the reference's own print.

  python -m benchmarks.airbench_reference --root /tmp/cifar_split --runs 1
"""

import argparse
import time
from math import ceil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import CIFAR10_MEAN, CIFAR10_STD, emit, machine
from project.data.image_reading import decode_image, scan_class_folders

HYP = {
    "opt": {"train_epochs": 9.9, "batch_size": 1024, "lr": 11.5, "momentum": 0.85, "weight_decay": 0.0153,
            "bias_scaler": 64.0, "label_smoothing": 0.2, "whiten_bias_epochs": 3},
    "aug": {"flip": True, "translate": 2},
    "net": {"widths": {"block1": 64, "block2": 256, "block3": 256}, "batchnorm_momentum": 0.6,
            "scaling_factor": 1 / 9, "tta_level": 2},
}  # fmt: skip


def load_split(
    folder: Path, classes: list[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """`folder/<class>/*` -> (N, 3, 32, 32) float images in [0, 1], labels, class names."""
    scan = scan_class_folders(folder, classes)
    images = np.stack([decode_image(f, 32) for f in scan.files])
    images = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)
    return images.contiguous(memory_format=torch.channels_last), torch.tensor(scan.labels), scan.classes


def batch_flip_lr(inputs):
    flip_mask = (torch.rand(len(inputs)) < 0.5).view(-1, 1, 1, 1)
    return torch.where(flip_mask, inputs.flip(-1), inputs)


def batch_crop(images, crop_size):
    r = (images.size(-1) - crop_size) // 2
    shifts = torch.randint(-r, r + 1, size=(len(images), 2))
    images_out = torch.empty((len(images), 3, crop_size, crop_size), dtype=images.dtype)
    for sy in range(-r, r + 1):
        for sx in range(-r, r + 1):
            mask = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            images_out[mask] = images[mask, :, r + sy : r + sy + crop_size, r + sx : r + sx + crop_size]
    return images_out


class Loader:
    """The reference's CifarLoader over tensors already in memory."""

    def __init__(self, images, labels, batch_size, aug=None, train=True):
        self.images, self.labels = images, labels
        self.mean, self.std = (
            torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1),
            torch.tensor(CIFAR10_STD).view(1, 3, 1, 1),
        )
        self.proc_images, self.epoch, self.aug = {}, 0, aug or {}
        self.batch_size, self.drop_last, self.shuffle = batch_size, train, train

    def normalize(self, x):
        return (x - self.mean) / self.std

    def __len__(self):
        return (
            len(self.images) // self.batch_size
            if self.drop_last
            else ceil(len(self.images) / self.batch_size)
        )

    def __iter__(self):
        if self.epoch == 0:
            images = self.proc_images["norm"] = self.normalize(self.images)
            if self.aug.get("flip", False):
                images = self.proc_images["flip"] = batch_flip_lr(images)
            pad = self.aug.get("translate", 0)
            if pad > 0:
                self.proc_images["pad"] = F.pad(images, (pad,) * 4, "reflect")
        if self.aug.get("translate", 0) > 0:
            images = batch_crop(self.proc_images["pad"], self.images.shape[-2])
        elif self.aug.get("flip", False):
            images = self.proc_images["flip"]
        else:
            images = self.proc_images["norm"]
        if self.aug.get("flip", False) and self.epoch % 2 == 1:
            images = images.flip(-1)
        self.epoch += 1
        indices = (torch.randperm if self.shuffle else torch.arange)(len(images))
        for i in range(len(self)):
            idxs = indices[i * self.batch_size : (i + 1) * self.batch_size]
            yield images[idxs], self.labels[idxs]


class Mul(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class BatchNorm(nn.BatchNorm2d):
    def __init__(self, num_features, momentum, eps=1e-12, weight=False, bias=True):
        super().__init__(num_features, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad = weight
        self.bias.requires_grad = bias


class Conv(nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size=3, padding="same", bias=False):
        super().__init__(in_channels, out_channels, kernel_size=kernel_size, padding=padding, bias=bias)

    def reset_parameters(self):
        super().reset_parameters()
        if self.bias is not None:
            self.bias.data.zero_()
        w = self.weight.data
        torch.nn.init.dirac_(w[: w.size(1)])


class ConvGroup(nn.Module):
    def __init__(self, channels_in, channels_out, batchnorm_momentum):
        super().__init__()
        self.conv1 = Conv(channels_in, channels_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = BatchNorm(channels_out, batchnorm_momentum)
        self.conv2 = Conv(channels_out, channels_out)
        self.norm2 = BatchNorm(channels_out, batchnorm_momentum)
        self.activ = nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


def make_net(num_classes):
    widths, momentum = HYP["net"]["widths"], HYP["net"]["batchnorm_momentum"]
    whiten_width = 2 * 3 * 2**2
    net = nn.Sequential(
        Conv(3, whiten_width, 2, padding=0, bias=True),
        nn.GELU(),
        ConvGroup(whiten_width, widths["block1"], momentum),
        ConvGroup(widths["block1"], widths["block2"], momentum),
        ConvGroup(widths["block2"], widths["block3"], momentum),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(widths["block3"], num_classes, bias=False),
        Mul(HYP["net"]["scaling_factor"]),
    )
    net[0].weight.requires_grad = False
    return net.to(memory_format=torch.channels_last)


def init_whitening_conv(layer, train_set, eps=5e-4):
    c, (h, w) = train_set.shape[1], layer.weight.shape[2:]
    patches = train_set.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
    flat = patches.view(len(patches), -1)
    eigenvalues, eigenvectors = torch.linalg.eigh((flat.T @ flat) / len(flat), UPLO="U")
    eigenvalues, eigenvectors = (
        eigenvalues.flip(0).view(-1, 1, 1, 1),
        eigenvectors.T.reshape(c * h * w, c, h, w).flip(0),
    )
    scaled = eigenvectors / torch.sqrt(eigenvalues + eps)
    layer.weight.data[:] = torch.cat((scaled, -scaled))


class LookaheadState:
    def __init__(self, net):
        self.net_ema = {k: v.clone() for k, v in net.state_dict().items()}

    def update(self, net, decay):
        for ema_param, net_param in zip(self.net_ema.values(), net.state_dict().values(), strict=True):
            if net_param.dtype == torch.float:
                ema_param.lerp_(net_param, 1 - decay)
                net_param.copy_(ema_param)


def infer(model, loader, tta_level=0):
    def infer_mirror(inputs):
        return 0.5 * model(inputs) + 0.5 * model(inputs.flip(-1))

    def infer_mirror_translate(inputs):
        logits = infer_mirror(inputs)
        padded = F.pad(inputs, (1,) * 4, "reflect")
        translated = [infer_mirror(padded[:, :, 0:32, 0:32]), infer_mirror(padded[:, :, 2:34, 2:34])]
        return 0.5 * logits + 0.5 * torch.stack(translated).mean(0)

    model.eval()
    infer_fn = [model, infer_mirror, infer_mirror_translate][tta_level]
    with torch.no_grad():
        return torch.cat([infer_fn(x) for x in loader.normalize(loader.images).split(2000)])


def evaluate(model, loader, tta_level=0):
    return (infer(model, loader, tta_level).argmax(1) == loader.labels).float().mean().item()


def train(train_loader, test_loader, num_classes, run, epochs=HYP["opt"]["train_epochs"]):
    opt = HYP["opt"]
    batch_size, momentum = train_loader.batch_size, opt["momentum"]
    kilostep_scale = 1024 * (1 + 1 / (1 - momentum))
    lr = opt["lr"] / kilostep_scale
    wd = opt["weight_decay"] * batch_size / kilostep_scale
    lr_biases = lr * opt["bias_scaler"]
    loss_fn = nn.CrossEntropyLoss(label_smoothing=opt["label_smoothing"], reduction="none")
    total_train_steps = ceil(len(train_loader) * epochs)

    model = make_net(num_classes)
    norm_biases = [p for k, p in model.named_parameters() if "norm" in k and p.requires_grad]
    other_params = [p for k, p in model.named_parameters() if "norm" not in k and p.requires_grad]
    optimizer = torch.optim.SGD(
        [dict(params=norm_biases, lr=lr_biases, weight_decay=wd / lr_biases),
         dict(params=other_params, lr=lr, weight_decay=wd / lr)],
        momentum=momentum, nesterov=True,
    )  # fmt: skip

    def get_lr(step):
        warmup_steps = int(total_train_steps * 0.23)
        if step < warmup_steps:
            frac = step / warmup_steps
            return 0.2 * (1 - frac) + 1.0 * frac
        frac = (step - warmup_steps) / (total_train_steps - warmup_steps)
        return 1.0 * (1 - frac) + 0.07 * frac

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, get_lr)
    alpha_schedule = 0.95**5 * (torch.arange(total_train_steps + 1) / total_train_steps) ** 3
    lookahead_state = LookaheadState(model)

    start = time.perf_counter()
    init_whitening_conv(model[0], train_loader.normalize(train_loader.images[:5000]))
    current_steps = 0
    for epoch in range(ceil(epochs)):
        model[0].bias.requires_grad = epoch < opt["whiten_bias_epochs"]
        model.train()
        for inputs, labels in train_loader:
            loss = loss_fn(model(inputs), labels).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            current_steps += 1
            if current_steps % 5 == 0:
                lookahead_state.update(model, decay=alpha_schedule[current_steps].item())
            if current_steps >= total_train_steps:
                lookahead_state.update(model, decay=1.0)
                break
        train_seconds = time.perf_counter() - start
        emit(
            run=run,
            epoch=epoch,
            test_acc=round(evaluate(model, test_loader), 4),
            train_seconds=round(train_seconds, 1),
        )
    tta_acc = evaluate(model, test_loader, tta_level=HYP["net"]["tta_level"])
    emit(run=run, tta_test_acc=round(tta_acc, 4), seconds=round(time.perf_counter() - start, 1))
    return tta_acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, required=True, help="folder with train/<class>/ and test/<class>/"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--epochs", type=float, default=HYP["opt"]["train_epochs"], help="the reference's 9.9"
    )
    parser.add_argument(
        "--batch_size", type=int, default=HYP["opt"]["batch_size"], help="the reference's 1024"
    )
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train_images, train_labels, classes = load_split(args.root / "train")
    test_images, test_labels, _ = load_split(args.root / "test", classes)
    emit(machine=machine(), train_images=len(train_images), test_images=len(test_images))
    accs = []
    for run in range(args.runs):  # fresh loaders per run, as the reference builds them
        train_loader = Loader(train_images, train_labels, args.batch_size, aug=HYP["aug"])
        test_loader = Loader(test_images, test_labels, 2000, train=False)
        accs.append(train(train_loader, test_loader, len(classes), run, args.epochs))
    emit(tta_test_acc_mean=round(sum(accs) / len(accs), 4), runs=len(accs))


if __name__ == "__main__":
    main()
