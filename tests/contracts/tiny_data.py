"""Tiny labelled image data for the contract suites, written into a folder that need not exist yet: a class
folder, CSVs of classes, tags and values, fake CIFAR files. Dozens of 8-pixel images: every check runs in
seconds."""

from pathlib import Path

import numpy as np
from PIL import Image

from tests.fakes import class_images, make_fake_cifar, make_image_folder, patch_cifar_integrity

CLASSES = ("a", "b", "c")
TAGS = ("blue", "red", "round")
IMAGES = 24


def class_folder(root: Path) -> None:
    """`root/<c0..c2>/*`: 3 classes of 5 images of mixed sizes and modes (JPEG and PNG)."""
    make_image_folder(root, classes=3, per_class=5, extras=False)


def coloured_images(folder: Path, n: int = IMAGES, seed: int = 0) -> list[str]:
    """`n` 8x8 PNGs `folder/img/<i>.png`, coloured by `i % 3`; their paths relative to `folder`."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(class_images(i % 3, 1, 8, rng, 3)[0]).save(folder / "img" / f"{i}.png")
    return [f"img/{i}.png" for i in range(n)]


def write_csv(path: Path, header: str, rows: list[str]) -> None:
    path.write_text("\n".join([header, *rows]) + "\n")


def classes_csv(root: Path) -> None:
    """`root/labels.csv`: one class of CLASSES per image."""
    paths = coloured_images(root)
    write_csv(root / "labels.csv", "path,label", [f"{p},{CLASSES[i % 3]}" for i, p in enumerate(paths)])


def tags_csv(root: Path) -> None:
    """`root/tags.csv`: any subset of TAGS per image (every subset of the three, the empty one too)."""
    paths = coloured_images(root)
    rows = [f"{p},{' '.join(t for bit, t in enumerate(TAGS) if i >> bit & 1)}" for i, p in enumerate(paths)]
    write_csv(root / "tags.csv", "path,tags", rows)


def values_csv(root: Path) -> None:
    """`root/values.csv`: one real value per image."""
    paths = coloured_images(root)
    values = np.random.default_rng(1).uniform(-20, 20, len(paths))
    write_csv(root / "values.csv", "path,angle", [f"{p},{v:.3f}" for p, v in zip(paths, values, strict=True)])


def cifar(root: Path) -> None:
    """Fake CIFAR-10 files in `root`: 100 training and 20 test images (torchvision's checksums patched)."""
    patch_cifar_integrity()
    make_fake_cifar(root, per_batch=20, n_test=20)
