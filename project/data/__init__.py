"""DataModules: where images come from and how batches are made. They know nothing about the network."""

from project.data.cifar import CIFARDataModule
from project.data.datamodule import ImageDataModule
from project.data.folder import ImageFolderDataModule

__all__ = ["CIFARDataModule", "ImageDataModule", "ImageFolderDataModule"]
