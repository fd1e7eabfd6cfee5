"""The csv part's example for the data seam's contract (tests/contracts/test_sources.py): a CSV of classes."""

from pathlib import Path

from project.csv.labels import ImageCSVDataModule
from project.data.targets import Classes
from tests.contracts.tiny_data import CLASSES, Source, coloured_images, files, write_csv


def classes_csv(root: Path) -> None:
    """`root/labels.csv`: one class of CLASSES per image."""
    paths = coloured_images(root)
    write_csv(root / "labels.csv", "path,label", [f"{p},{CLASSES[i % 3]}" for i, p in enumerate(paths)])


SOURCES = [
    Source("csv-classes", Classes, lambda root: ImageCSVDataModule(str(root / "labels.csv"), **files(root)),
           classes_csv, ("ImageCSVDataModule", "CSVLabels"), "configs/csv.yaml", ("--data.csv", "{root}/labels.csv")),
]  # fmt: skip
