"""The multi-label canvases of benchmarks/multilabel_canvas.py: each tagged with the classes pasted on it."""

from PIL import Image

from tests.csv.test_csv_data import csv_dm, write_images


def test_multilabel_canvases_are_tagged_with_the_classes_pasted(tmp_path, monkeypatch):
    import sys

    from benchmarks import multilabel_canvas

    for name in ("ant", "bee", "cow"):
        write_images(tmp_path / "src" / name, 6, seed=len(name))
    argv = [
        "x",
        "--src",
        str(tmp_path / "src"),
        "--dst",
        str(tmp_path / "c"),
        "--train",
        "12",
        "--test",
        "4",
        "--size",
        "16",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    multilabel_canvas.main()
    dm = csv_dm(tmp_path / "c" / "train.csv", tmp_path, kind="tags", val_fraction=0.25)
    assert dm.class_names == ["ant", "bee", "cow"] and len(dm.train_files) == 12
    assert all(1 <= len(tags) <= 3 for tags in dm.train_labels)
    with Image.open(dm.train_files[0]) as im:
        assert im.size == (16, 16)
