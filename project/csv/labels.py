"""Images anywhere, their labels in a CSV (one row per image: path, label, tags or values): the `CSVLabels`
source, and `ImageCSVDataModule`, the DataModule that holds one (`data.csv` and the settings of every source of
image files).

What a row's labels mean is here, read through the kind of target (`cells`); reading the CSV and finding the files
it names is `reading`.
"""

from pathlib import Path
from typing import Any

from project.csv.cells import CellReading, OneName, check_label_shape, other_kind
from project.csv.reading import CSVFiles, cell, column, find_csv_files, listed_images, read_csv
from project.data.file_source import FileSource
from project.data.image_reading import Label, LabelledFiles
from project.data.label_checks import data_warning, nfc, shown
from project.data.labelled_files import ImageFilesDataModule
from project.data.targets import TargetKind
from project.errors import UserError
from project.registry import load, registered


class CSVLabels(FileSource):
    """Images listed in a CSV with their labels.

    The CSV has a header row, then one row per image: its path, relative to `images` (or absolute), with or
    without its extension (`cat/001` finds `cat/001.jpg`), and its label. Class names are the training CSV's
    labels, sorted (as numbers when they all are). Validation is split off the training CSV by `val_fraction`
    unless `val_csv` is given; testing uses `test_csv` if given, else validation. An image listed twice with the
    same label counts once (with a warning); with two different labels it is an error.

    The labels are of the kind of target `kind` names (one registered by a package present, project.registry):
    `classes` (one class name per image) by default. A kind of other labels says how the CSV writes them: tags,
    say, as one column of tags separated by `label_separator` or one 0/1 column per tag (`label_columns`).

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
        kind: The kind of target the labels are (`classes`, or another registered kind: `tags`, `values`, ...).
        label_separator: What separates the names in one label cell (tags). Default: any whitespace.
        label_columns: Columns of one name each (a 0/1 column per tag, a column per value), in the order the
            model's outputs take, instead of `label_column`; for a kind whose labels have several names.
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
        kind: str = "classes",
        label_separator: str | None = None,
        label_columns: list[str] | None = None,
    ) -> None:
        if label_columns is not None and label_column is not None:
            raise UserError(
                "give data.label_column (one column of labels) or data.label_columns (a column per name), not both"
            )
        if kind not in registered("target_kinds"):
            raise UserError(
                f"data.kind {kind!r} is not a kind of target here; the kinds: {', '.join(registered('target_kinds'))}"
            )
        #: The kind of the labels, and how the CSV writes them (the kind's own cells, or one name per image).
        self.target_kind: type[TargetKind] = load("target_kinds", kind)
        self.reading: CellReading = self.target_kind if hasattr(self.target_kind, "read_cells") else OneName  # pyright: ignore[reportAttributeAccessIssue]
        if label_columns is not None and self.reading is OneName:
            raise UserError(
                f"data.label_columns reads a column per name, and data.kind {kind!r} has one name per image: give "
                f"its label column (data.label_column), or the kind the columns hold{other_kind('tags', 'such as')}"
            )
        if label_separator == "":
            raise UserError(
                "data.label_separator is empty: give the text between tags (such as ';'), or leave it unset to "
                "split tags at whitespace"
            )
        self._given = (csv, val_csv, test_csv, predict_csv, images)
        self.path_column, self.label_column, self.label_columns = path_column, label_column, label_columns
        self.label_separator = label_separator
        self._found: CSVFiles | None = None

    def _files(self) -> CSVFiles:
        """The files the settings name, checked once, when the data is first read."""
        if self._found is None:
            self._found = find_csv_files(*self._given)
        return self._found

    @property
    def csvs(self) -> dict[str, Path]:
        """The CSV of each split the data has (`train`, and `val`/`test` where given)."""
        return self._files().csvs

    @property
    def images(self) -> Path:
        """The folder the CSVs' paths are relative to."""
        return self._files().images

    def scan(self, split: str, train: LabelledFiles | None) -> LabelledFiles | None:
        if split not in self.csvs:
            return None
        path = self.csvs[split]
        header, rows, digest = read_csv(path)
        self._forms: dict[str, set[str]] = {}  # a non-ASCII name (NFC) -> the ways the CSV writes it
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
            found = self._files().finder.find(value)
            if found is None:
                missing.append((row, value))
                continue
            if isinstance(found, list):
                raise UserError(
                    f"{path} row {row}: {shown(value)} matches {len(found)} images ({', '.join(found)}); give the extension"
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
        if split == "train" and self.reading is OneName:
            check_label_shape(path, row_numbers, written)
        if empty := [row for row, label in zip(row_numbers, written, strict=True) if label == ""]:
            more = f" (and {len(empty) - 1} more row(s))" if len(empty) > 1 else ""
            raise UserError(
                f"{path} row {empty[0]}: the label in column {header[label_at[0]]!r} is empty{more}: give every "
                f"row a label{other_kind('tags', 'a row of a multi-label CSV may have no tag')}"
            )
        if written_twice := [forms for forms in self._forms.values() if len(forms) > 1]:
            forms = sorted(written_twice[0])
            data_warning(
                f"{path} writes the label {shown(nfc(forms[0]))} in {len(forms)} Unicode forms (as "
                f"{' and '.join(map(ascii, forms))}), which print alike: they are read as one"
            )
        if missing:
            row, value = missing[0]
            more = f" (and {len(missing) - 1} more row(s))" if len(missing) > 1 else ""
            raise UserError(
                f"{path} row {row}: no image {shown(value)} in {self.images}{more}; data.images is the folder the "
                "paths are relative to"
            )
        if repeated:  # a repeated row would weigh its image twice, or put it in training and validation both
            rows_shown = ", ".join(map(str, repeated[:5])) + (" ..." if len(repeated) > 5 else "")
            data_warning(
                f"{path} row(s) {rows_shown} repeat an image listed before with the same label; each image counts once"
            )
        if train is None:
            columns = [header[i] for i in label_at]
            per_name, separator = self.label_columns is not None, self.label_separator
            classes = self.reading.names_read(written, row_numbers, columns, per_name, separator, str(path))
        else:
            classes = train.classes
            self._warn_overlap(path, files, row_numbers, train.files)
        return LabelledFiles(
            files, self._indices(path, row_numbers, written, classes), classes, stamps, digest
        )

    # -- reading labels ------------------------------------------------------------------------------------------
    def _label(self, path: Path, header: list[str], row: int, cells: list[str], at: list[int]) -> Any:
        """A row's label as written (a name, tags, values: as its kind reads them); `at`: the label column(s)."""
        read = [cell(path, row, cells, i, header) for i in at]
        columns, per_name = [header[i] for i in at], self.label_columns is not None
        try:
            return self.reading.read_cells(read, columns, per_name, self.label_separator, self._named)
        except ValueError as e:
            raise UserError(f"{path} row {row}: {e}") from None

    def _named(self, written: str) -> str:
        """A label (or tag) as written, in Unicode's composed form (NFC); its written forms noted."""
        if written.isascii():
            return written
        name = nfc(written)
        self._forms.setdefault(name, set()).add(written)
        return name

    def _indices(self, path: Path, rows: list[int], written: list[Any], classes: list[str]) -> list[Label]:
        """The labels with their names as indices of `classes`; a UserError for a name the training CSV lacks."""
        index = {name: i for i, name in enumerate(classes)}
        labels: list[Label] = []
        for row, label in zip(rows, written, strict=True):
            try:
                labels.append(self.reading.indexed(label, index))
            except KeyError as e:
                raise UserError(
                    f"{path} row {row}: label {shown(e.args[0])} is not among the labels of the training CSV "
                    f"{self.csvs['train']} ({', '.join(classes[:20])}{' ...' if len(classes) > 20 else ''}); "
                    "correct it, or add images of it to the training CSV"
                ) from None
        return labels

    def _warn_overlap(self, path: Path, files: list[str], rows: list[int], train_files: list[str]) -> None:
        """A warning when a validation or test CSV lists training images: their scores would flatter the model."""
        training = set(train_files)
        shared = [(row, file) for row, file in zip(rows, files, strict=True) if file in training]
        if shared:
            row, file = shared[0]
            data_warning(
                f"{path}: {len(shared)} image(s) are in the training CSV {self.csvs['train']} too (first: row {row}, "
                f"{file}); scores on images the model trained on overstate how well it does"
            )

    def labels_source(self) -> str:
        return str(self.csvs["train"])

    # -- splits and prediction ----------------------------------------------------------------------------------
    def split_with_val_split(self, split: object) -> str:
        return (
            f"data.split {split} with data.val_csv {self.csvs['val']}: it divides the training CSV, so the "
            "validation CSV would be ignored. Append its rows to the training CSV to divide all of them, or drop "
            "data.split to validate on it"
        )

    def predict_files(self) -> list[Path] | None:
        predict = self._files().predict
        return None if predict is None else listed_images(predict, self.path_column, self._files())


class ImageCSVDataModule(ImageFilesDataModule):
    """Images listed in a CSV with their labels (`CSVLabels`: classes, tags or values), decoded, cached, split
    and checked by `ImageFilesDataModule`. Validation is split off the training CSV by `val_fraction` unless
    `val_csv` is given. What the CSV settings mean in full is said by `CSVLabels`.

    Args:
        csv: The training CSV (a header row, then one row per image: its path, its label).
        images: The folder the CSVs' paths are relative to. Default: the training CSV's folder.
        val_csv: A CSV of validation images (same columns). Default: split off `csv` by `val_fraction`.
        test_csv: A CSV of test images (same columns). Default: test on the validation split.
        predict_csv: A CSV of images to predict (only its path column is read).
        path_column: The name of the column of image paths. Default: the first column.
        label_column: The name of the column of labels (or tags). Default: the second column.
        kind: The kind of target the labels are: `classes`, or another registered kind (`tags`, `values`, ...).
        label_separator: What separates the names in one label cell (tags). Default: any whitespace.
        label_columns: Columns of one name each (a 0/1 column per tag, a column per value), instead of one.
        **kwargs: The image, cache, split and loader settings of `ImageFilesDataModule` (image_size, cache,
            val_fraction, split, batch_size, ...).
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
        kind: str = "classes",
        label_separator: str | None = None,
        label_columns: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        labels = CSVLabels(
            csv, images, val_csv, test_csv, predict_csv, path_column, label_column, kind, label_separator,
            label_columns,
        )  # fmt: skip
        super().__init__(source=labels, **kwargs)


def _show(label: str | tuple[str, ...] | tuple[float, ...]) -> str:
    return shown(label if isinstance(label, str) else " ".join(map(str, label)))
