"""Images anywhere, their labels in a CSV: the `CSVLabels` source (`labels`), the `ImageCSVDataModule` that holds
one, and the reading of the CSV and of the files it names (`reading`). The labels are of any registered kind of
target (`data.kind`): the kind says how the CSV writes them."""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "datamodules": {"ImageCSVDataModule": ".labels"},
    "sources": {"CSVLabels": ".labels"},
}
