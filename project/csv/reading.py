"""Reading the CSVs of `CSVLabels`: which files its settings name (`find_csv_files`), the file itself (`read_csv`:
UTF-8, its header and rows), a row's cells and the header's columns, and the image files its paths name
(`FileFinder`, `listed_images`). Every error names the CSV, the row (as a spreadsheet numbers it: the header is
row 1) and the value.
"""

import csv
import hashlib
import io
import os
from pathlib import Path
from typing import NamedTuple

from project.data.image_reading import IMAGE_EXTENSIONS
from project.data.label_checks import shown
from project.errors import UserError


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
    records = _records(path, text)
    records = [(n, cells) for n, cells in records if any(cells)]
    if len(records) < 2:
        raise UserError(
            f"{path} has {'no rows' if not records else 'a header row only'}: expected a header (path,label), "
            "then one row per image"
        )
    return records[0][1], records[1:], hashlib.sha256(data).hexdigest()[:16]


def _records(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """(row number, stripped cells) of every row of `text`; a UserError naming the row csv cannot read."""
    reader = csv.reader(io.StringIO(text))
    records: list[tuple[int, list[str]]] = []
    try:
        for cells in reader:
            records.append((len(records) + 1, [c.strip() for c in cells]))
    except csv.Error as e:
        row = len(records) + 1
        lines = text.splitlines()
        line = lines[reader.line_num - 1] if 0 < reader.line_num <= len(lines) else ""
        if "field larger than field limit" in str(e):
            raise UserError(
                f"{path} row {row}: a cell is longer than {csv.field_size_limit():,} characters (the line starts "
                f'{shown(line)}), more than any path or label; is a quote (") left open above it?'
            ) from None
        raise UserError(f"{path} row {row}: not a CSV row ({e}): {shown(line)}") from None
    return records


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


def existing_file(path: str, key: str) -> Path:
    """`path` as a Path; a UserError naming the setting `key` when it is not a file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{key} {file} does not exist or is not a file")
    return file


def cell(path: Path, row: int, cells: list[str], at: int, header: list[str]) -> str:
    """The row's cell in column `at`; a UserError when the row has fewer cells than that."""
    if at >= len(cells):
        raise UserError(
            f"{path} row {row} has {len(cells)} cell(s); the header names {len(header)} ({', '.join(header)})"
        )
    return cells[at]


def column(path: Path, header: list[str], name: str | None, default: int | None, key: str) -> int:
    """The index of the column `name` (set by `key`), or the `default` one when no name is given."""
    if name is None:
        assert default is not None
        if default >= len(header):
            raise UserError(
                f"{path} row 1 (the header) has {len(header)} column(s) ({', '.join(header)}); expected at least "
                f"{default + 1}: the image path, then its label"
            )
        return default
    if name not in header:
        raise UserError(f"{path} has no column {name!r} ({key}); row 1 (the header) has: {', '.join(header)}")
    return header.index(name)


class CSVFiles(NamedTuple):
    """The files a CSV source's settings name, checked: the CSV of each split it has (`train`, and `val`/`test`
    where given), the CSV of images to predict, the folder the CSVs' paths are relative to, and its finder."""

    csvs: dict[str, Path]
    predict: Path | None
    images: Path
    finder: FileFinder


def find_csv_files(
    csv: str, val_csv: str | None, test_csv: str | None, predict_csv: str | None, images: str | None
) -> CSVFiles:
    """The CSVs and the images' folder the settings name (`images`: default, the training CSV's folder); a
    UserError naming the setting whose file or folder is missing."""
    csvs = {"train": existing_file(csv, "data.csv")}
    for split, given, key in (("val", val_csv, "data.val_csv"), ("test", test_csv, "data.test_csv")):
        if given is not None:
            csvs[split] = existing_file(given, key)
    predict = existing_file(predict_csv, "data.predict_csv") if predict_csv else None
    folder = Path(images).expanduser().resolve() if images else csvs["train"].resolve().parent
    if not folder.is_dir():
        raise UserError(f"data.images {folder} does not exist or is not a directory")
    return CSVFiles(csvs, predict, folder, FileFinder(folder))


def listed_images(path: Path, path_column: str | None, files: CSVFiles) -> list[Path]:
    """The images the CSV `path` lists in its path column (only that column is read), in its order."""
    header, rows, _ = read_csv(path)
    at = column(path, header, path_column, 0, "data.path_column")
    found_files = []
    for row, cells in rows:
        found = files.finder.find(value := cell(path, row, cells, at, header))
        if not isinstance(found, tuple):
            raise UserError(f"{path} row {row}: no single image {shown(value)} in {files.images}")
        found_files.append(Path(found[0]))
    return found_files
