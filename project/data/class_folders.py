"""Images in one folder per class: the `ClassFolders` source, and `ImageFolderDataModule`, which holds one."""

from pathlib import Path
from typing import Any

from project.data.file_source import FileSource
from project.data.image_reading import LabelledFiles, scan_class_folders
from project.data.labelled_files import ImageFilesDataModule
from project.errors import UserError


class ClassFolders(FileSource):
    """Images in class folders, of any size and mode. Layouts (class names come from the folder names, sorted):

    - `root/train/<class>/*` with optional `root/val/<class>/*` and `root/test/<class>/*`;
    - or `root/<class>/*`, split into train/val by the DataModule's `val_fraction` (stratified, seeded).

    Files with other extensions are skipped.

    Args:
        root: Dataset folder (see the layouts above).
    """

    def __init__(self, root: str) -> None:
        self.root = Path(root).expanduser()

    @property
    def train_dir(self) -> Path:
        """The folder of the training classes: `root/train`, or `root` itself."""
        if not self.root.is_dir():
            raise UserError(f"data.root {self.root} does not exist or is not a directory")
        return self.root / "train" if (self.root / "train").is_dir() else self.root

    def _split_dir(self, split: str) -> Path | None:
        """`root/val` or `root/test` beside `root/train`, or None."""
        folder = self.root / split
        return folder if self.train_dir != self.root and folder.is_dir() else None

    @property
    def val_dir(self) -> Path | None:
        return self._split_dir("val")

    @property
    def test_dir(self) -> Path | None:
        return self._split_dir("test")

    def scan(self, split: str, train: LabelledFiles | None) -> LabelledFiles | None:
        if train is None:
            return scan_class_folders(self.train_dir)
        folder = {"val": self.val_dir, "test": self.test_dir}.get(split)
        return None if folder is None else scan_class_folders(folder, train.classes)

    def labels_source(self) -> str:
        return str(self.train_dir)

    def split_with_val_split(self, split: object) -> str:
        return (
            f"data.split {split} with the validation folder {self.val_dir}: it divides the training images, so "
            f"that folder would be ignored. Move its images into {self.root / 'train'}/<class>/ to divide all of "
            "them, or drop data.split to validate on it"
        )


class ImageFolderDataModule(ImageFilesDataModule):
    """Images in class folders (`ClassFolders`), decoded, cached, split and checked by `ImageFilesDataModule`.

    Args:
        root: Dataset folder: `root/train/<class>/*` (with optional `root/val`, `root/test`), or `root/<class>/*`.
        **kwargs: The image, cache, split and loader settings of `ImageFilesDataModule` (image_size, cache,
            val_fraction, split, batch_size, ...).
    """

    def __init__(self, root: str, **kwargs: Any) -> None:
        super().__init__(source=ClassFolders(root), **kwargs)
