"""benchmarks/labels_from_csv.py: a CSV copy of class folders gives the folder module's files, labels and split."""

from tests.csv.test_csv_data import csv_dm, write_images


def test_a_csv_copy_of_class_folders_gives_the_folder_modules_files_labels_and_split(tmp_path):
    from benchmarks.labels_from_csv import write_csv as write_folder_csv
    from project.data import ImageFolderDataModule
    from project.data.image_reading import list_images

    for name in ("ant", "bee", "cow"):
        write_images(tmp_path / "ds" / name, 5, seed=len(name))
    folder = ImageFolderDataModule(str(tmp_path / "ds"), image_size=8, cache_dir=str(tmp_path / "cache"))
    write_folder_csv(
        tmp_path / "labels.csv", tmp_path / "ds", list_images(tmp_path / "ds"), strip_extension=True
    )
    from_csv = csv_dm(tmp_path / "labels.csv", tmp_path, images=str(tmp_path / "ds"))
    assert from_csv.class_names == folder.class_names and from_csv.train_files == folder.train_files
    assert from_csv.train_labels == folder.train_labels and from_csv._split() == folder._split()
