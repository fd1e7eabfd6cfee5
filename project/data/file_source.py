"""`FileSource`: where labelled image files are and what their labels mean, and nothing else.

An `ImageFilesDataModule` holds a source and asks it, split by split, for the files and their labels; the
decoding, the cache, the validation split, the folds, the statistics and the bad-input guards are the
DataModule's, the same for every source. Building a source reads nothing: `scan` reads, when the DataModule
first needs the data (the data -> model links ask for the class names before anything trains).
`ClassFolders` (project.data.class_folders) is the core's; a part may register more (`sources`).
"""

from abc import ABC, abstractmethod
from pathlib import Path

from project.data.image_reading import LabelledFiles
from project.data.targets import Classes, TargetKind


class FileSource(ABC):
    """Labelled image files, split by split. A subclass implements `scan`; the rest has defaults."""

    #: The kind of the labels `scan` gives (`project.data.targets`); a source whose settings choose it (a CSV of
    #: classes, tags or values) sets it in its `__init__`.
    target_kind: type[TargetKind] = Classes

    @abstractmethod
    def scan(self, split: str, train: LabelledFiles | None) -> LabelledFiles | None:
        """The files and labels of `split` (`train`, `val`, `test`), or None when the source has no such split
        (validation is then split off the training files; testing falls back to validation).

        `train` is the training split's scan when `split` is `val` or `test` (None for `train` itself): their
        labels index its classes, in its order. A label is a class index, the tuple of an image's tag indices,
        or the tuple of its values, as `target_kind` reads them."""

    def labels_source(self) -> str:
        """Where the training labels come from, as warnings about them name it."""
        return "the training data"

    def split_with_val_split(self, split: object) -> str:
        """The message for a `data.split` given with a source that has its own validation split."""
        return (
            f"data.split {split}: it divides the training images, and the data has a validation split of its own "
            "that would be ignored; drop data.split to validate on it"
        )

    def predict_files(self) -> list[Path] | None:
        """The images `predict` reads when the source names them (a CSV of images to predict); None leaves
        the choice to the DataModule (its `predict_root`, else the test split, else validation)."""
        return None
