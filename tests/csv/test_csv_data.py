"""Images with their labels in a CSV (project/csv): single- and multi-label, every bad CSV named
by file, row and value, the cache keyed by the CSV, validation splits and folds (iterative stratification for
multi-label data), and a fit through the CLI."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.cli import main
from project.csv.labels import ImageCSVDataModule
from project.data.splits import HoldOut
from project.data.targets import Classes
from project.errors import UserError
from tests.conftest import CONFIGS

TAGS = ["cat", "dog", "sky"]


def write_images(folder: Path, n: int, seed: int = 0) -> list[str]:
    """`n` 8x8 PNGs `folder/<i>.png` of random colours; their names."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return [f"{i}.png" for i in range(n)]


def write_csv(path: Path, rows: list[str], header: str = "file,label") -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def dataset(tmp_path: Path, n: int = 12) -> Path:
    """`tmp_path/data/labels.csv` over `tmp_path/data/img/<i>.png`: labels a, b, c in turn."""
    write_images(tmp_path / "data" / "img", n)
    return write_csv(tmp_path / "data" / "labels.csv", [f"img/{i}.png,{'abc'[i % 3]}" for i in range(n)])


def tagged(tmp_path: Path, n: int = 30, seed: int = 0) -> Path:
    """`tmp_path/data/tags.csv`: each image with a random subset of TAGS (some with none), as a space-separated
    column `tags` and as one 0/1 column per tag."""
    write_images(tmp_path / "data" / "img", n)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        has = [bool(rng.random() < 0.4) for _ in TAGS]
        tags = " ".join(t for t, h in zip(TAGS, has, strict=True) if h)
        rows.append(f"img/{i}.png,{tags},{','.join(str(int(h)) for h in has)}")
    return write_csv(tmp_path / "data" / "tags.csv", rows, header="file,tags," + ",".join(TAGS))


def csv_dm(csv: Path, tmp_path: Path, **kwargs) -> ImageCSVDataModule:
    settings = dict(image_size=8, cache_dir=str(tmp_path / "cache"), num_workers=0, batch_size=4)
    return ImageCSVDataModule(csv=str(csv), **{**settings, **kwargs})


# -- reading the CSV -------------------------------------------------------------------------------------------
def test_paths_with_or_without_extension_named_columns_and_numeric_labels(tmp_path):
    write_images(tmp_path / "pics" / "sub", 4)
    absolute = tmp_path / "pics" / "sub" / "3.png"
    rows = ["x,sub/0.png,10", "y,sub/1,2", "z,sub/2,10", f"w,{absolute},2"]
    (tmp_path / "meta").mkdir()
    csv = write_csv(tmp_path / "meta" / "labels.csv", rows, header="id,path,class")
    dm = csv_dm(csv, tmp_path, images=str(tmp_path / "pics"), path_column="path", label_column="class")
    assert dm.class_names == ["2", "10"] and isinstance(dm.targets, Classes)  # numbers sort as numbers
    assert [Path(f).name for f in dm.train_files] == ["0.png", "1.png", "2.png", "3.png"]
    assert dm.train_labels == [1, 0, 1, 0]


def test_images_default_to_the_csv_folder_and_batches_are_uint8_and_int64(tmp_path):
    dm = csv_dm(dataset(tmp_path), tmp_path)
    assert dm.class_names == ["a", "b", "c"] and dm.num_classes == 3
    pickle.loads(pickle.dumps(dm))  # DDP's spawn and notebook launchers pickle the DataModule
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == 12
    assert sorted(dm.val_set.targets[dm.val_set.indices].tolist()) == [0, 1, 2]  # stratified: one per class
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 8, 8) and y.dtype == torch.int64 and y.shape == (4,)


def bad_csv_cases(tmp_path: Path) -> dict[str, tuple[dict, list[str]]]:
    """name -> (DataModule settings, strings its error must contain). Each CSV is written here."""
    d = tmp_path / "data"
    write_images(d / "img", 6)
    good = [f"img/{i}.png,{'ab'[i % 2]}" for i in range(6)]
    w = write_csv
    (d / "latin1.csv").write_bytes("file,label\nimg/0.png,a\nimg/1.png,caf\xe9\n".encode("latin-1"))
    (d / "img" / "0.jpg").write_bytes((d / "img" / "0.png").read_bytes())  # img/0 is then ambiguous
    return {
        "missing-file": ({"csv": w(d / "m.csv", [*good[:2], "img/nope.png,a", "img/gone.png,b"])}, ["m.csv row 4", "'img/nope.png'", "and 1 more row"]),
        "no-such-column": ({"csv": w(d / "c.csv", good), "label_column": "kind"}, ["c.csv", "'kind'", "row 1", "file, label"]),
        "empty-label": ({"csv": w(d / "e.csv", [*good[:3], "img/3.png,"])}, ["e.csv row 5", "'label'", "empty"]),
        "two-labels": ({"csv": w(d / "t.csv", [*good, "img/2.png,b"])}, ["t.csv rows 4 and 8", "2.png", "'a' and 'b'"]),
        "empty": ({"csv": w(d / "empty.csv", [], header="")}, ["empty.csv has no rows"]),
        "header-only": ({"csv": w(d / "h.csv", [])}, ["h.csv has a header row only"]),
        "not-utf8": ({"csv": d / "latin1.csv"}, ["latin1.csv row 3", "not UTF-8", "\\xe9"]),
        "short-row": ({"csv": w(d / "s.csv", [*good[:2], "img/2.png"])}, ["s.csv row 4 has 1 cell", "file, label"]),
        "ambiguous": ({"csv": w(d / "amb.csv", ["img/0,a", *good[1:]])}, ["amb.csv row 2", "'img/0'", "0.jpg, 0.png"]),
        "one-class": ({"csv": w(d / "one.csv", [f"img/{i}.png,a" for i in range(6)])}, ["one.csv has 1 distinct label", "a"]),
        "val-label": (
            {"csv": w(d / "tr.csv", good), "val_csv": w(d / "v.csv", ["img/0.png,a", "img/1.png,zebra"])},
            ["v.csv row 3", "'zebra'", "tr.csv"],
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "missing-file",
        "no-such-column",
        "empty-label",
        "two-labels",
        "empty",
        "header-only",
        "not-utf8",
        "short-row",
        "ambiguous",
        "one-class",
        "val-label",
    ],
)
def test_a_bad_csv_is_named_with_its_row_and_value(tmp_path, case):
    settings, expected = bad_csv_cases(tmp_path)[case]
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    with pytest.raises(UserError) as error:
        dm = csv_dm(Path(settings.pop("csv")), tmp_path, **settings)
        dm.setup("fit")
    message = str(error.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, (part, message)


def test_an_image_listed_twice_with_the_same_label_counts_once(tmp_path, capsys):
    write_images(tmp_path / "img", 4)
    rows = ["img/0.png,a", "img/1.png,b", "img/0,a", "img/2.png,a", "img/3.png,b"]
    dm = csv_dm(write_csv(tmp_path / "l.csv", rows), tmp_path)
    assert len(dm.train_files) == 4 and dm.train_labels == [0, 1, 0, 1]
    assert "l.csv row(s) 4 repeat an image" in capsys.readouterr().err


def test_a_bad_csv_through_the_cli_is_one_error_line(tmp_path, capsys):
    settings, expected = bad_csv_cases(tmp_path)["missing-file"]
    args = ["fit", "--config", str(CONFIGS / "csv.yaml"), "--data.csv", str(settings["csv"])]
    with pytest.raises(SystemExit):
        main([*args, "--trainer.default_root_dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err and "m.csv row 4" in errors[0], err


# -- the cache, splits and prediction ---------------------------------------------------------------------------
def test_the_cache_is_rebuilt_when_the_csv_changes(tmp_path):
    csv = dataset(tmp_path)
    csv_dm(csv, tmp_path).setup("fit")
    csv_dm(csv, tmp_path).setup("fit")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1  # the same CSV: reused
    csv.write_text(csv.read_text().replace("img/0.png,a", "img/0.png,b"))  # the same files, one label changed
    dm = csv_dm(csv, tmp_path)
    dm.setup("fit")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2
    assert dm.train_labels[0] == 1


def test_val_test_and_predict_csvs(tmp_path, capsys):
    csv = dataset(tmp_path)
    d = csv.parent
    val = write_csv(d / "val.csv", ["img/0.png,a", "img/1.png,b"])
    test = write_csv(d / "test.csv", ["img/2.png,c"])
    predict = write_csv(d / "predict.csv", ["img/5", "img/4.png"], header="file")
    dm = csv_dm(csv, tmp_path, val_csv=str(val), test_csv=str(test), predict_csv=str(predict))
    for stage in ("fit", "test", "predict"):
        dm.setup(stage)
    assert (
        len(dm.train_set) == 12
        and dm.val_set.targets.tolist() == [0, 1]
        and dm.test_set.targets.tolist() == [2]
    )
    assert [Path(n).name for n in dm.predict_names] == ["5.png", "4.png"]
    assert "val.csv: 2 image(s) are in the training CSV" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"data.split HoldOut\(0.5\) with data.val_csv"):
        csv_dm(csv, tmp_path, val_csv=str(val), split=HoldOut(0.5)).class_names  # noqa: B018  # the first scan


def test_unreadable_images_in_a_csv_are_named_or_left_out(tmp_path, capsys):
    csv = dataset(tmp_path)
    (csv.parent / "img" / "4.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match=r"4\.png.*skip_corrupt"):
        csv_dm(csv, tmp_path).setup("fit")
    dm = csv_dm(csv, tmp_path, skip_corrupt=True, cache=False)
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == 11 and "leaving out 1 unreadable" in capsys.readouterr().err


# -- multi-label -----------------------------------------------------------------------------------------------
# -- through the CLI ------------------------------------------------------------------------------------------
def test_fit_with_configs_csv_yaml(tmp_path):
    csv = dataset(tmp_path)
    args = [
        "fit", "--config", CONFIGS / "csv.yaml", "--data.csv", csv, "--data.cache_dir", tmp_path / "cache",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "4", "--model.net.init_args.hidden", "8",
        "--data.image_size", "8", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.fast_dev_run", "true",
        "--data.split", "HoldOut", "--data.split.fraction", "0.25",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", tmp_path / "logs",
    ]  # fmt: skip
    main([str(a) for a in args])
