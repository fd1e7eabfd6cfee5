"""Class names checked at every start (project/data/label_checks.py): names that split one class in two (case, a
typo, Unicode forms) and single-image classes are one warning line each, and the run goes on."""

import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.cli import main
from project.data import ImageFolderDataModule
from project.data.label_checks import check_class_names
from tests.conftest import CONFIGS

DECOMPOSED = unicodedata.normalize("NFD", "café")
COMPOSED = unicodedata.normalize("NFC", "café")


def write_images(folder: Path, n: int, seed: int = 0) -> None:
    """`n` 8x8 PNGs `folder/<i>.png` of random colours."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_a_typo_and_single_images_are_one_warning_line_each_and_the_fit_goes_on(tmp_path, capsys):
    for name, n in (("cat", 6), ("dog", 6), ("dgo", 1)):
        write_images(tmp_path / "images" / name, n)
    args = [
        "fit", "--config", CONFIGS / "folder.yaml", "--data.root", tmp_path / "images",
        "--data.cache_dir", tmp_path / "cache", "--model.net", "SimpleCNN", "--model.net.init_args.width", "4",
        "--model.net.init_args.hidden", "8", "--data.image_size", "8", "--data.batch_size", "4",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.fast_dev_run", "true",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", tmp_path / "logs",
    ]  # fmt: skip
    main([str(a) for a in args])  # returns: the fit went on
    said = warnings_of(capsys.readouterr().err)
    typo = [w for w in said if "one character away" in w]
    single = [w for w in said if "single image" in w]
    assert len(typo) == len(single) == 1, said
    assert "'dgo' (1 image)" in typo[0] and "'dog' (6 images)" in typo[0] and "images" in typo[0]
    assert "1 class" in single[0] and "'dgo'" in single[0]


def test_names_that_differ_only_in_case_are_one_warning_line(capsys):
    check_class_names(["Cat", "cat", "dog"], [1, 6, 6], "labels.csv")
    (said,) = [w for w in warnings_of(capsys.readouterr().err) if "differ only in case" in w]
    assert "'Cat' (1 image) and 'cat' (6 images)" in said and "labels.csv" in said


@pytest.mark.parametrize(
    "names, counts",
    [
        (["a", "b", "c"], [1000, 2, 2]),  # short names differ by one letter on purpose
        (["batch1", "batch2"], [100, 3]),  # so do numbered ones
        (["cat", "bat", "rat"], [40, 40, 40]),  # a class as big as its neighbour is no typo
    ],
)
def test_names_apart_on_purpose_are_not_called_typos(names, counts, capsys):
    check_class_names(names, counts, "labels.csv")
    assert "one character away" not in capsys.readouterr().err


def test_the_checks_cost_milliseconds_on_sixty_thousand_labels(capsys):
    names = [f"class_{i:05d}_{chr(97 + i % 26)}" for i in range(600)]
    counts = [100] * 599 + [1]  # 60,000 images, one class of one image
    start = time.perf_counter()
    check_class_names(names, counts, "labels.csv")
    assert time.perf_counter() - start < 0.5
    assert len(warnings_of(capsys.readouterr().err)) == 1  # the single image


def test_class_folders_in_two_unicode_forms_are_one_class(tmp_path, capsys):
    for folder, n in ((COMPOSED, 3), (DECOMPOSED, 2), ("tea", 4)):
        write_images(tmp_path / "root" / folder, n)
    dm = ImageFolderDataModule(
        str(tmp_path / "root"), image_size=8, cache_dir=str(tmp_path / "c"), num_workers=0
    )
    assert dm.class_names == [COMPOSED, "tea"] and dm.train_labels.count(0) == 5
    (said,) = warnings_of(capsys.readouterr().err)
    assert "two Unicode forms" in said and "one class" in said
