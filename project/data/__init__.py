"""DataModules: where images come from and how batches are made. They know nothing about the network.

`ImageDataModule` holds the loaders and the batched augmentation; `ImageFilesDataModule` what every source of
labelled image files shares (cache, splits, folds, statistics, guards), each source saying only where its files
and labels are (`scan`): `ImageFolderDataModule` reads class folders, `ImageCSVDataModule` a CSV of paths and
labels (or tags: multi-label data). CIFAR is held in memory as it comes.
"""

from project.data.cifar import CIFARDataModule
from project.data.class_folders import ImageFolderDataModule
from project.data.csv_labels import ImageCSVDataModule
from project.data.datamodule import ImageDataModule
from project.data.labelled_files import ImageFilesDataModule

__all__ = [
    "CIFARDataModule",
    "ImageCSVDataModule",
    "ImageDataModule",
    "ImageFilesDataModule",
    "ImageFolderDataModule",
]
