"""The side of the cached squares follows the input: `data.source_scale` is it as a multiple of `data.image_size`,
so the photos preset cuts its crops from a larger image at any input size; `data.cache_size` stays for an
absolute side, and giving both is one error line."""

from pathlib import Path

import numpy as np
import pytest

from project.cli import main
from project.data import ImageFolderDataModule
from project.errors import UserError
from tests.conftest import CONFIGS
from tests.folder_fits import tiny_fit_args, tiny_folder
from tests.test_data import cli_error


def photos_fit(tmp_path: Path, *extra: object) -> list[str]:
    """`fit` of configs/folder.yaml with the photos preset stacked as users stack it, on a tiny folder."""
    args = tiny_fit_args(tiny_folder(tmp_path / "images"), tmp_path, *extra)
    return ["fit", *args[:2], "--config", str(CONFIGS / "experiment" / "photos.yaml"), *args[2:]]


def cached_shapes(cache_dir: Path) -> set[tuple[int, ...]]:
    return {np.load(f, mmap_mode="r").shape[1:] for f in cache_dir.rglob("*.npy")}


@pytest.mark.parametrize(("image_size", "side"), [(64, 96), (96, 144)])
def test_the_photos_preset_caches_squares_one_and_a_half_times_its_input(tmp_path, image_size, side):
    main(photos_fit(tmp_path, "--data.image_size", image_size, "--trainer.fast_dev_run", "true"))
    assert cached_shapes(tmp_path / "cache") == {(3, side, side)}


def test_an_absolute_side_replaces_the_presets_scale(tmp_path):
    absolute = ["--data.source_scale", "null", "--data.cache_size", "20"]
    main(photos_fit(tmp_path, *absolute, "--trainer.fast_dev_run", "true"))
    assert cached_shapes(tmp_path / "cache") == {(3, 20, 20)}


def test_a_cache_size_on_top_of_the_presets_scale_is_one_line_naming_both(tmp_path, capsys):
    line = cli_error(photos_fit(tmp_path, "--data.cache_size", "20"), capsys)
    assert "data.cache_size=20 and data.source_scale=1.5" in line and "--data.source_scale null" in line
    assert not (tmp_path / "logs").exists() and not (tmp_path / "cache").exists()


def test_the_scale_rounds_to_whole_pixels_and_a_source_smaller_than_the_input_is_refused(tmp_path):
    assert ImageFolderDataModule(str(tmp_path), image_size=16, source_scale=1.5).source_size == 24
    assert ImageFolderDataModule(str(tmp_path), image_size=20, source_scale=1.33).source_size == 27
    with pytest.raises(UserError, match=r"data.source_scale must be between 1 and .* got 0.5"):
        ImageFolderDataModule(str(tmp_path), image_size=16, source_scale=0.5)
