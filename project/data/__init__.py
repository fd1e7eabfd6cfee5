"""DataModules: where images come from and how batches are made. They know nothing about the network.

`ImageDataModule` holds the loaders and the batched augmentation; `ImageFilesDataModule` what every source of
labelled image files shares (cache, splits, statistics, guards), holding a `FileSource` that says only where its
files and labels are (`scan`): `ClassFolders` reads class folders. `ImageFolderDataModule` holds one, with its
settings at the top of `data.*`. CIFAR is held in memory as it comes. Nothing is imported here: a fit imports
the modules its config names (project.registry).
"""

import importlib
from typing import Any

from project.data.datamodule import ImageDataModule  # what every command types its data as

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "target_kinds": {"classes": ".targets:Classes"},
    "datamodules": {
        "CIFARDataModule": ".cifar",
        "ImageFilesDataModule": ".labelled_files",
        "ImageFolderDataModule": ".class_folders",
    },
    "sources": {"ClassFolders": ".class_folders"},
}

#: Where each class of `__all__` lives, imported on first use (`from project.data import X`).
_MODULES = {
    "CIFARDataModule": "cifar",
    "ClassFolders": "class_folders",
    "FileSource": "file_source",
    "ImageFilesDataModule": "labelled_files",
    "ImageFolderDataModule": "class_folders",
}
__all__ = ["ImageDataModule"]  # and, imported on first use, the classes of `_MODULES`


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
