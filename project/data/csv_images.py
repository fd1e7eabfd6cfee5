"""`ImageCSVDataModule`: images anywhere, their labels in a CSV (one row per image: path, label or tags).

What a row's labels mean is here; reading the CSV and finding the files it names is project.data.csv_files.
"""

from pathlib import Path
from typing import Any

from project.data.csv_files import FileFinder, cell, column, existing_file, read_csv
from project.data.image_files import ImageFilesDataModule
from project.data.images import Label, LabelledFiles
from project.errors import UserError, warn

#: The values of a label column (`label_columns`) that say an image has, or has not, its tag.
ONE, ZERO = {"1", "1.0"}, {"0", "0.0"}


class ImageCSVDataModule(ImageFilesDataModule):
    """Images listed in a CSV with their labels (decoded, cached, split and checked by `ImageFilesDataModule`).

    The CSV has a header row, then one row per image: its path, relative to `images` (or absolute), with or
    without its extension (`cat/001` finds `cat/001.jpg`), and its label. Class names are the training CSV's
    labels, sorted (as numbers when they all are). Validation is split off the training CSV by `val_fraction`
    unless `val_csv` is given; testing uses `test_csv` if given, else validation. An image listed twice with the
    same label counts once (with a warning); with two different labels it is an error.

    Multi-label data (an image has any number of tags, none included) comes as one column of tags separated by
    `label_separator` (`multilabel: true`), or as one 0/1 column per tag (`label_columns`). The tag names
    are then the class names, and each target is a float32 multi-hot row over them.

    Every error names the CSV, the row (as a spreadsheet numbers it: the header is row 1) and the value.

    Args:
        csv: The training CSV.
        images: The folder the CSVs' paths are relative to. Default: the training CSV's folder.
        val_csv: A CSV of validation images (same columns). Default: split off `csv` by `val_fraction`.
        test_csv: A CSV of test images (same columns). Default: test on the validation split.
        predict_csv: A CSV of images to predict (only its path column is read). Default: `predict_root`, else
            the test split, else the validation split.
        path_column: The name of the column of image paths. Default: the first column.
        label_column: The name of the column of labels (or tags). Default: the second column.
        multilabel: The label column holds each image's tags, separated by `label_separator` (none is allowed).
        label_separator: What separates tags in the label column. Default: any whitespace.
        label_columns: Columns of 0/1 values, one per tag, in the order the model's outputs take (implies
            multi-label; `label_column` is not read).
        **kwargs: The image, cache, split and loader settings of `ImageFilesDataModule` (image_size, cache,
            val_fraction, num_folds, batch_size, ...).
    """

    def __init__(
        self,
        csv: str,
        images: str | None = None,
        val_csv: str | None = None,
        test_csv: str | None = None,
        predict_csv: str | None = None,
        path_column: str | None = None,
        label_column: str | None = None,
        multilabel: bool = False,
        label_separator: str | None = None,
        label_columns: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.csvs = {"train": existing_file(csv, "data.csv")}
        for split, path, key in (("val", val_csv, "data.val_csv"), ("test", test_csv, "data.test_csv")):
            if path is not None:
                self.csvs[split] = existing_file(path, key)
        self.predict_csv = existing_file(predict_csv, "data.predict_csv") if predict_csv else None
        self.images = Path(images).expanduser().resolve() if images else self.csvs["train"].resolve().parent
        if not self.images.is_dir():
            raise UserError(f"data.images {self.images} does not exist or is not a directory")
        if label_columns is not None and label_column is not None:
            raise UserError(
                "give data.label_column (one column of labels) or data.label_columns (0/1 columns), not both"
            )
        if label_columns is not None and not label_columns:
            raise UserError("data.label_columns is empty: name the 0/1 columns, one per tag")
        self.path_column, self.label_column, self.label_columns = path_column, label_column, label_columns
        self._multilabel = multilabel or label_columns is not None
        self.label_separator = label_separator
        self._finder = FileFinder(self.images)
        super().__init__(**kwargs)

    @property
    def multilabel(self) -> bool:
        return self._multilabel

    def scan(self, split: str) -> LabelledFiles | None:
        if split not in self.csvs:
            return None
        path = self.csvs[split]
        header, rows, digest = read_csv(path)
        path_at = column(path, header, self.path_column, 0, "data.path_column")
        if self.label_columns is not None:
            label_at = [column(path, header, name, None, "data.label_columns") for name in self.label_columns]
        else:
            label_at = [column(path, header, self.label_column, 1, "data.label_column")]
        files, stamps, written, row_numbers = [], [], [], []  # written: each label as the CSV spells it
        position: dict[str, int] = {}  # file -> its place in `files`
        missing: list[tuple[int, str]] = []
        repeated: list[int] = []
        for row, cells in rows:
            value = cell(path, row, cells, path_at, header)
            if not value:
                raise UserError(f"{path} row {row}: the image path is empty")
            found = self._finder.find(value)
            if found is None:
                missing.append((row, value))
                continue
            if isinstance(found, list):
                raise UserError(
                    f"{path} row {row}: {value!r} matches {len(found)} images ({', '.join(found)}); give the extension"
                )
            file, stamp = found
            label = self._label(path, header, row, cells, label_at)
            if file in position:
                before = position[file]
                if written[before] != label:
                    raise UserError(
                        f"{path} rows {row_numbers[before]} and {row} both list {file} with different labels "
                        f"({_show(written[before])} and {_show(label)}); keep one"
                    )
                repeated.append(row)
                continue
            position[file] = len(files)
            files.append(file)
            stamps.append(stamp)
            written.append(label)
            row_numbers.append(row)
        if missing:
            row, value = missing[0]
            more = f" (and {len(missing) - 1} more row(s))" if len(missing) > 1 else ""
            raise UserError(
                f"{path} row {row}: no image {value!r} in {self.images}{more}; data.images is the folder the "
                "paths are relative to"
            )
        if repeated:  # a repeated row would weigh its image twice, or put it in training and validation both
            shown = ", ".join(map(str, repeated[:5])) + (" ..." if len(repeated) > 5 else "")
            warn(
                f"{path} row(s) {shown} repeat an image listed before with the same label; each image counts once"
            )
        if split == "train":
            classes = self._classes(path, written)
        else:
            classes = self.class_names
            self._warn_overlap(path, files, row_numbers)
        return LabelledFiles(
            files, self._indices(path, row_numbers, written, classes), classes, stamps, digest
        )

    # -- reading labels ------------------------------------------------------------------------------------------
    def _label(
        self, path: Path, header: list[str], row: int, cells: list[str], at: list[int]
    ) -> str | tuple[str, ...]:
        """A row's label (single-label) or its tags (multi-label), as written; `at`: the label column(s)."""
        values = [cell(path, row, cells, i, header) for i in at]
        if self.label_columns is not None:
            for name, value in zip(self.label_columns, values, strict=True):
                if value not in ONE | ZERO:
                    raise UserError(
                        f"{path} row {row}: column {name!r} holds {value!r}; label_columns hold 0 or 1"
                    )
            return tuple(name for name, value in zip(self.label_columns, values, strict=True) if value in ONE)
        if self.multilabel:
            return tuple(
                sorted({tag.strip() for tag in values[0].split(self.label_separator) if tag.strip()})
            )
        if not values[0]:
            raise UserError(f"{path} row {row}: the label in column {header[at[0]]!r} is empty")
        return values[0]

    def _classes(self, path: Path, written: list[Any]) -> list[str]:
        """The class (or tag) names, from the training CSV's labels."""
        if self.label_columns is not None:
            return list(self.label_columns)
        names = {tag for tags in written for tag in tags} if self.multilabel else set(written)
        if not self.multilabel and len(names) < 2:
            raise UserError(
                f"{path} has {len(names)} distinct label(s) ({', '.join(names)}): a classifier needs at least two"
            )
        numeric = all(n.lstrip("-").isdigit() for n in names)
        return sorted(names, key=lambda n: (int(n), n) if numeric else (0, n))

    def _indices(self, path: Path, rows: list[int], written: list[Any], classes: list[str]) -> list[Label]:
        """Labels as class indices (tags as tuples of indices); a UserError for one the training CSV lacks."""
        index = {name: i for i, name in enumerate(classes)}
        labels: list[Label] = []
        for row, label in zip(rows, written, strict=True):
            for name in label if self.multilabel else (label,):
                if name not in index:
                    raise UserError(
                        f"{path} row {row}: label {name!r} is not among the labels of the training CSV "
                        f"{self.csvs['train']} ({', '.join(classes[:20])}{' ...' if len(classes) > 20 else ''})"
                    )
            labels.append(tuple(index[t] for t in label) if self.multilabel else index[label])
        return labels

    def _warn_overlap(self, path: Path, files: list[str], rows: list[int]) -> None:
        """A warning when a validation or test CSV lists training images: their scores would flatter the model."""
        training = set(self.train_files)
        shared = [(row, file) for row, file in zip(rows, files, strict=True) if file in training]
        if shared:
            row, file = shared[0]
            warn(
                f"{path}: {len(shared)} image(s) are in the training CSV {self.csvs['train']} too (first: row {row}, "
                f"{file}); scores on images the model trained on overstate how well it does"
            )

    # -- splits and prediction ----------------------------------------------------------------------------------
    def folds_with_val_split(self) -> str:
        return (
            f"data.num_folds={self.num_folds} with data.val_csv {self.csvs['val']}: the folds are drawn from the "
            "training CSV, so the validation CSV would be ignored. Append its rows to the training CSV to "
            "cross-validate over all of them, or drop data.num_folds to validate on it"
        )

    def predict_files(self) -> list[Path]:
        if self.predict_csv is None:
            return super().predict_files()
        header, rows, _ = read_csv(self.predict_csv)
        at = column(self.predict_csv, header, self.path_column, 0, "data.path_column")
        files = []
        for row, cells in rows:
            found = self._finder.find(value := cell(self.predict_csv, row, cells, at, header))
            if not isinstance(found, tuple):
                raise UserError(f"{self.predict_csv} row {row}: no single image {value!r} in {self.images}")
            files.append(Path(found[0]))
        return files


def _show(label: str | tuple[str, ...]) -> str:
    return repr(label) if isinstance(label, str) else repr(" ".join(label))
