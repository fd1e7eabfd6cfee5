"""DataModules: where images come from and how batches are made. They know nothing about the network.

`ImageDataModule` holds the loaders and the batched augmentation; `ImageFilesDataModule` what every source of
labelled image files shares (cache, splits, folds, statistics, guards), holding a `FileSource` that says only
where its files and labels are (`scan`): `ClassFolders` reads class folders, `CSVLabels` a CSV of paths and
labels (classes, tags or values). `ImageFolderDataModule` and `ImageCSVDataModule` are the DataModules holding
each, with their settings at the top of `data.*`. CIFAR is held in memory as it comes.
"""

from project.data.cifar import CIFARDataModule
from project.data.class_folders import ClassFolders, ImageFolderDataModule
from project.data.csv_labels import CSVLabels, ImageCSVDataModule
from project.data.datamodule import ImageDataModule
from project.data.file_source import FileSource
from project.data.labelled_files import ImageFilesDataModule

__all__ = [
    "CIFARDataModule",
    "CSVLabels",
    "ClassFolders",
    "FileSource",
    "ImageCSVDataModule",
    "ImageDataModule",
    "ImageFilesDataModule",
    "ImageFolderDataModule",
]
