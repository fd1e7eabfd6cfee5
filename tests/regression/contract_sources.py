"""The values' example for the data seam's contract (tests/contracts/test_sources.py): a CSV of real values."""

from pathlib import Path

import numpy as np

from project.csv.labels import ImageCSVDataModule
from project.regression.kind import Values
from tests.contracts.tiny_data import Source, coloured_images, files, write_csv


def values_csv(root: Path) -> None:
    """`root/values.csv`: one real value per image."""
    paths = coloured_images(root)
    values = np.random.default_rng(1).uniform(-20, 20, len(paths))
    write_csv(root / "values.csv", "path,angle", [f"{p},{v:.3f}" for p, v in zip(paths, values, strict=True)])


SOURCES = [
    Source("csv-values", Values, lambda root: ImageCSVDataModule(str(root / "values.csv"), kind="values", **files(root)),
           values_csv, ("ImageCSVDataModule", "CSVLabels"), "configs/csv_regression.yaml",
           ("--data.csv", "{root}/values.csv")),
]  # fmt: skip
