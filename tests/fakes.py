"""Small synthetic datasets for the tests: fake CIFAR batch files and generated image folders.

Nothing here touches the network. The fake CIFAR files have the real on-disk format (pickled batches),
but not the real checksums, so tests patch torchvision's integrity check (and only tests do).
"""

import pickle
from pathlib import Path

import numpy as np
from PIL import Image
from torchvision import datasets
from torchvision.datasets import cifar

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def class_images(label: int, n: int, size: int, rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """(n, size, size, 3) uint8 images whose colour depends on the label: learnable in a few steps."""
    base = np.zeros(3)
    base[label % 3] = 60 + 190 * (label / max(1, num_classes - 1))
    noise = rng.normal(0, 25, size=(n, size, size, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def make_fake_cifar(
    root: Path, name: str = "cifar10", per_batch: int = 100, n_test: int = 100, seed: int = 0
) -> Path:
    """Writes `root/cifar-10-batches-py` (or `cifar-100-python`) with 5 x `per_batch` train and `n_test` test images."""
    rng = np.random.default_rng(seed)
    num_classes = 10 if name == "cifar10" else 100
    label_key = "labels" if name == "cifar10" else "fine_labels"

    def batch(n: int) -> dict:
        labels = rng.integers(0, num_classes, n)
        data = np.concatenate([class_images(int(y), 1, 32, rng, num_classes) for y in labels])
        return {"data": data.transpose(0, 3, 1, 2).reshape(n, -1), label_key: labels.tolist()}

    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(1, 6):
            (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(per_batch)))
        (folder / "test_batch").write_bytes(pickle.dumps(batch(n_test)))
        (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": CIFAR10_CLASSES}))
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "train").write_bytes(pickle.dumps(batch(5 * per_batch)))
        (folder / "test").write_bytes(pickle.dumps(batch(n_test)))
        (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"c{i}" for i in range(100)]}))
    return root


def patch_cifar_integrity() -> None:
    """Accept the fake files: torchvision checks the real archive's MD5 sums."""
    datasets.CIFAR10._check_integrity = lambda self: True  # CIFAR100 inherits it
    cifar.check_integrity = lambda *args, **kwargs: True


def make_image_folder(
    root: Path, classes: int = 3, per_class: int = 12, seed: int = 0, extras: bool = True
) -> Path:
    """`root/<class>/*` with images of mixed sizes and modes (RGB, L, RGBA, P), JPEG and PNG.

    With `extras`, adds a non-image file (skipped) and a corrupt `.jpg` (an error, or skipped with
    `skip_corrupt`) to class `c0`.
    """
    rng = np.random.default_rng(seed)
    modes = ["RGB", "L", "RGBA", "P"]
    for c in range(classes):
        folder = root / f"c{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(20, 80)), int(rng.integers(20, 80))
            image = Image.fromarray(class_images(c, 1, max(h, w), rng, classes)[0][:h, :w])
            mode = modes[i % len(modes)]
            image = image.convert(mode) if mode != "P" else image.convert("P", palette=Image.Palette.ADAPTIVE)
            image.save(folder / f"img{i}.{'jpg' if mode in ('RGB', 'L') else 'png'}")
    if extras:
        (root / "c0" / "notes.txt").write_text("not an image")
        (root / "c0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    return root


def bomb_png(width: int = 20_000, height: int = 20_000) -> bytes:
    """A PNG of about a hundred bytes whose header declares `width` x `height` 8-bit RGB pixels: a
    decompression bomb (gigabytes once decoded; here the data is not even there)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )
