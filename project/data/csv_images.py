"""`ImageCSVDataModule`: images anywhere, their labels in a CSV (one row per image: path, label or tags)."""

import csv
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from project.data.image_files import ImageFilesDataModule
from project.data.images import IMAGE_EXTENSIONS, Label, LabelledFiles
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
        self.csvs = {"train": _existing(csv, "data.csv")}
        for split, path, key in (("val", val_csv, "data.val_csv"), ("test", test_csv, "data.test_csv")):
            if path is not None:
                self.csvs[split] = _existing(path, key)
        self.predict_csv = _existing(predict_csv, "data.predict_csv") if predict_csv else None
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
        path_at = self._column(path, header, self.path_column, 0, "data.path_column")
        if self.label_columns is not None:
            label_at = [
                self._column(path, header, name, None, "data.label_columns") for name in self.label_columns
            ]
        else:
            label_at = [self._column(path, header, self.label_column, 1, "data.label_column")]
        files, stamps, written, row_numbers = [], [], [], []  # written: each label as the CSV spells it
        position: dict[str, int] = {}  # file -> its place in `files`
        missing: list[tuple[int, str]] = []
        repeated: list[int] = []
        for row, cells in rows:
            value = _cell(path, row, cells, path_at, header)
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
        values = [_cell(path, row, cells, i, header) for i in at]
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

    def _column(self, path: Path, header: list[str], name: str | None, default: int | None, key: str) -> int:
        if name is None:
            assert default is not None
            if default >= len(header):
                raise UserError(
                    f"{path} row 1 (the header) has {len(header)} column(s) ({', '.join(header)}); expected at least "
                    f"{default + 1}: the image path, then its label"
                )
            return default
        if name not in header:
            raise UserError(
                f"{path} has no column {name!r} ({key}); row 1 (the header) has: {', '.join(header)}"
            )
        return header.index(name)

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
        at = self._column(self.predict_csv, header, self.path_column, 0, "data.path_column")
        files = []
        for row, cells in rows:
            found = self._finder.find(value := _cell(self.predict_csv, row, cells, at, header))
            if not isinstance(found, tuple):
                raise UserError(f"{self.predict_csv} row {row}: no single image {value!r} in {self.images}")
            files.append(Path(found[0]))
        return files


def read_csv(path: Path) -> tuple[list[str], list[tuple[int, list[str]]], str]:
    """(header, [(row number, cells)], sha256 of the bytes) of a UTF-8 CSV; blank rows count but are skipped.
    A UserError for a CSV that is not UTF-8 or has no rows below its header."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # Excel's "CSV UTF-8" starts with a byte-order mark
    except UnicodeDecodeError as e:
        row = data[: e.start].count(b"\n") + 1
        raise UserError(
            f"{path} row {row} is not UTF-8 text (bytes {data[e.start : e.start + 4]!r}): save the CSV as UTF-8 "
            '("CSV UTF-8" in a spreadsheet)'
        ) from None
    records = [(n, [c.strip() for c in cells]) for n, cells in enumerate(csv.reader(io.StringIO(text)), 1)]
    records = [(n, cells) for n, cells in records if any(cells)]
    if len(records) < 2:
        raise UserError(
            f"{path} has {'no rows' if not records else 'a header row only'}: expected a header (path,label), "
            "then one row per image"
        )
    return records[0][1], records[1:], hashlib.sha256(data).hexdigest()[:16]


class FileFinder:
    """Image files under `root` by the path a CSV gives, with or without extension: each folder listed once."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        #: folder -> (its file names, image names by name without extension)
        self.folders: dict[str, tuple[set[str], dict[str, list[str]]]] = {}

    def find(self, relative: str) -> tuple[str, tuple[int, int]] | list[str] | None:
        """(absolute path, (size, mtime)) of the file, the candidates when several images share the name
        without extension, or None when there is no such file."""
        folder, name = os.path.split(os.path.normpath(os.path.join(self.root, relative)))
        if folder not in self.folders:
            try:
                with os.scandir(folder) as entries:
                    names = {e.name for e in entries if e.is_file()}
            except OSError:  # no such folder: the files in it are missing
                names = set()
            stems: dict[str, list[str]] = {}
            for n in sorted(names):
                if n.lower().endswith(IMAGE_EXTENSIONS):
                    stems.setdefault(os.path.splitext(n)[0], []).append(n)
            self.folders[folder] = (names, stems)
        names, stems = self.folders[folder]
        found = [name] if name in names else stems.get(name, [])
        if len(found) != 1:
            return found or None
        path = os.path.join(folder, found[0])
        st = os.stat(path)
        return path, (st.st_size, st.st_mtime_ns)


def _existing(path: str, key: str) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{key} {file} does not exist or is not a file")
    return file


def _cell(path: Path, row: int, cells: list[str], at: int, header: list[str]) -> str:
    if at >= len(cells):
        raise UserError(
            f"{path} row {row} has {len(cells)} cell(s); the header names {len(header)} ({', '.join(header)})"
        )
    return cells[at]


def _show(label: str | tuple[str, ...]) -> str:
    return repr(label) if isinstance(label, str) else repr(" ".join(label))
