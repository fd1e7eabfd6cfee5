"""Tiny labelled image data for the contract suites, written into a folder that need not exist yet, and the
examples the suites check: `Source` (a DataModule on its tiny data). The core's are here (`SOURCES`); a part's are
in its `tests/<part>/contract_sources.py` (its `SOURCES`), found by `sources()`. Dozens of 8-pixel images: every
check runs in seconds."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from project.data.datamodule import ImageDataModule
from project.data.targets import TargetKind
from tests.fakes import class_images, make_fake_cifar, make_image_folder, patch_cifar_integrity

CLASSES = ("a", "b", "c")
IMAGES = 24
#: Loader settings of every source here: small batches, in this process.
LOADER = {"batch_size": 4, "num_workers": 0}


@dataclass(frozen=True)
class Source:
    """A DataModule built on the folder `root` (before anything is there), the tiny data it reads written into
    `root`, the kind of target it gives, and the registered classes it exercises (`registered`: DataModules and
    sources by their registered names). `config` and `fit_flags` (`{root}`: the data's folder) name that data in a
    shipped config, for the tasks' runs through the command line."""

    id: str
    kind: type[TargetKind]
    build: Callable[[Path], ImageDataModule]
    write: Callable[[Path], None]
    registered: tuple[str, ...] = ()
    config: str | None = None
    fit_flags: tuple[str, ...] = field(default=())


def files(root: Path, **settings) -> dict:
    """The settings of a source of image files: 8-pixel images, the cache beside `root` (not in the home folder)."""
    return {"image_size": 8, "cache_dir": str(root.parent / "cache"), **LOADER, **settings}


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


def cifar(root: Path) -> None:
    """Fake CIFAR-10 files in `root`: 100 training and 20 test images (torchvision's checksums patched)."""
    patch_cifar_integrity()
    make_fake_cifar(root, per_batch=20, n_test=20)


def _sources() -> list[Source]:
    from project.data import CIFARDataModule, ClassFolders, ImageFilesDataModule, ImageFolderDataModule
    from project.data.targets import Classes
    from tests.contracts.stream_source import ShadeStreamDataModule

    return [
        Source("CIFAR", Classes, lambda root: CIFARDataModule(data_dir=str(root), download=False, val_size=20, **LOADER),
               cifar, ("CIFARDataModule",)),
        Source("class-folder", Classes, lambda root: ImageFolderDataModule(str(root), **files(root)), class_folder,
               ("ImageFolderDataModule", "ClassFolders"), "configs/folder.yaml", ("--data.root", "{root}")),
        # The same source held by the DataModule of image files itself, as a config of a source of one's own reads
        Source("class-folder-held", Classes,
               lambda root: ImageFilesDataModule(ClassFolders(str(root)), **files(root)), class_folder,
               ("ImageFilesDataModule", "ClassFolders")),
        # Not registered: a source of another shape as a user writes one (tests/contracts/stream_source.py).
        Source("user-stream", Classes, lambda root: ShadeStreamDataModule(**LOADER), lambda root: None),
    ]  # fmt: skip


def sources() -> list[Source]:
    """The core's examples, then those of every part present (`tests/<part>/contract_sources.py`, by name)."""
    found = _sources()
    for path in sorted(Path(__file__).parent.parent.glob("*/contract_sources.py")):
        found += importlib.import_module(f"tests.{path.parent.name}.contract_sources").SOURCES
    return found
