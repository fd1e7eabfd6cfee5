"""The tags' example for the data seam's contract (tests/contracts/test_sources.py): a CSV of tags."""

from pathlib import Path

from project.csv.labels import ImageCSVDataModule
from project.tags.kind import Tags
from tests.contracts.tiny_data import Source, coloured_images, files, write_csv

TAGS = ("blue", "red", "round")


def tags_csv(root: Path) -> None:
    """`root/tags.csv`: any subset of TAGS per image (every subset of the three, the empty one too)."""
    paths = coloured_images(root)
    rows = [f"{p},{' '.join(t for bit, t in enumerate(TAGS) if i >> bit & 1)}" for i, p in enumerate(paths)]
    write_csv(root / "tags.csv", "path,tags", rows)


SOURCES = [
    Source("csv-tags", Tags,
           lambda root: ImageCSVDataModule(str(root / "tags.csv"), kind="tags", **files(root, val_fraction=0.25)),
           tags_csv, ("ImageCSVDataModule", "CSVLabels"), "configs/csv_multilabel.yaml",
           ("--data.csv", "{root}/tags.csv")),
]  # fmt: skip
