import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.data import CIFARDataModule, ImageFolderDataModule
from project.data.decoded_cache import ImageCache
from project.errors import UserError


# -- CIFAR ---------------------------------------------------------------------------------------------------
def test_cifar_split_is_seeded_and_batches_are_uint8(fake_cifar):
    dm = CIFARDataModule(data_dir=str(fake_cifar), download=False, val_size=100, batch_size=32)
    dm.setup("fit")
    assert len(dm.train_set) == 400 and len(dm.val_set) == 100
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (32, 3, 32, 32) and y.dtype == torch.long
    again = CIFARDataModule(data_dir=str(fake_cifar), download=False, val_size=100)
    again.setup("fit")
    assert torch.equal(dm.val_set.indices, again.val_set.indices)
    assert not set(dm.val_set.indices.tolist()) & set(dm.train_set.indices.tolist())
    other_seed = CIFARDataModule(data_dir=str(fake_cifar), download=False, val_size=100, seed=1)
    other_seed.setup("fit")
    assert not torch.equal(dm.val_set.indices, other_seed.val_set.indices)


def test_cifar_test_and_predict_sets(fake_cifar):
    dm = CIFARDataModule(data_dir=str(fake_cifar), download=False, batch_size=64)
    dm.setup("predict")
    x, idx = next(iter(dm.predict_dataloader()))
    assert torch.equal(idx, torch.arange(64))
    assert len(dm.predict_names) == 100 and dm.predict_names[3] == "cifar10/test/3"
    assert len(dm.test_set) == 100


def test_cifar_loads_the_same_pixels_as_torchvision(fake_cifar):
    from torchvision.datasets import CIFAR10

    dm = CIFARDataModule(data_dir=str(fake_cifar), download=False)
    dm.setup("test")
    ref = CIFAR10(str(fake_cifar), train=False)
    x, y = dm.test_set.__getitems__([5])
    assert torch.equal(x[0].permute(1, 2, 0), torch.from_numpy(ref.data[5])) and y.item() == ref.targets[5]


def test_cifar_missing_says_where_to_put_the_archive(tmp_path):
    dm = CIFARDataModule(data_dir=str(tmp_path), download=False)
    with pytest.raises(UserError, match=r"cifar-10-python\.tar\.gz.*" + str(tmp_path)):
        dm.setup("fit")


def test_cifar_class_names_match_torchvision_order():
    assert CIFARDataModule(name="cifar10").class_names[:3] == ["airplane", "automobile", "bird"]
    names = CIFARDataModule(name="cifar100").class_names
    assert len(names) == 100 and names == sorted(names) and names[-1] == "worm"


@pytest.mark.parametrize(
    "kwargs", [{"val_size": 0}, {"val_size": 60000}, {"batch_size": 0}, {"num_workers": -1}]
)
def test_cifar_bad_values_name_the_key(kwargs):
    (key,) = kwargs
    with pytest.raises(UserError, match=f"data.{key}"):
        CIFARDataModule(**kwargs)


# -- image folders --------------------------------------------------------------------------------------------
def folder_dm(root: Path, tmp_path: Path, **kwargs) -> ImageFolderDataModule:
    return ImageFolderDataModule(
        root=str(root),
        image_size=32,
        cache_dir=str(tmp_path / "cache"),
        num_workers=0,
        batch_size=8,
        **kwargs,
    )


def test_folder_mixed_modes_and_sizes(image_folder, tmp_path, capsys):
    dm = folder_dm(image_folder, tmp_path, skip_corrupt=True)
    assert dm.class_names == ["c0", "c1", "c2"] and dm.num_classes == 3
    dm.setup("fit")
    assert "warning: leaving out 1 unreadable image(s):" in capsys.readouterr().err  # whatever the filters
    assert len(dm.train_set) + len(dm.val_set) == 36  # notes.txt skipped, broken.jpg left out
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.uint8
    # Stratified: every class is in the validation split.
    assert set(dm.val_set.targets[dm.val_set.indices].tolist()) == {0, 1, 2}
    assert all(0 < m < 1 for m in dm.mean) and all(0 < s < 1 for s in dm.std)


def test_folder_corrupt_file_is_named(image_folder, tmp_path):
    dm = folder_dm(image_folder, tmp_path)
    with pytest.raises(UserError, match=r"broken\.jpg.*skip_corrupt"):
        dm.setup("fit")


@pytest.mark.parametrize("cache", [True, False])
def test_folder_cached_and_per_image_paths_agree(image_folder, tmp_path, cache):
    (image_folder / "c0" / "broken.jpg").unlink()
    dm = folder_dm(image_folder, tmp_path, cache=cache, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    dm.setup("fit")
    x, y = dm.val_set[0]
    ref = folder_dm(image_folder, tmp_path, cache=True, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    ref.setup("fit")
    assert torch.equal(x, ref.val_set[0][0]) and y == ref.val_set[0][1]


def test_folder_errors_name_the_path(tmp_path):
    missing = folder_dm(tmp_path / "missing", tmp_path)  # constructing reads nothing
    with pytest.raises(UserError, match="does not exist"):
        missing.class_names  # noqa: B018  # the first scan: what the data -> model links ask for
    (tmp_path / "empty_root").mkdir()
    with pytest.raises(UserError, match="no class sub-folders"):
        folder_dm(tmp_path / "empty_root", tmp_path).setup("fit")
    root = tmp_path / "root"
    (root / "cats").mkdir(parents=True)
    (root / "dogs").mkdir()
    Image.new("RGB", (10, 10)).save(root / "cats" / "a.png")
    (root / "dogs" / "readme.txt").write_text("no images here")
    with pytest.raises(UserError, match=r"class folder .*dogs contains no images"):
        folder_dm(root, tmp_path).class_names  # noqa: B018


def test_folder_train_val_test_layout_and_predict_root(tmp_path):
    from tests.fakes import make_image_folder

    for split in ("train", "val", "test"):
        make_image_folder(tmp_path / "ds" / split, per_class=4, extras=False, seed=len(split))
    unlabeled = tmp_path / "unlabeled" / "deep"
    unlabeled.mkdir(parents=True)
    for i in range(3):
        Image.new("L", (50 + i, 40)).save(unlabeled / f"{i}.png")
    dm = folder_dm(tmp_path / "ds", tmp_path, predict_root=str(tmp_path / "unlabeled"))
    dm.setup("fit")
    dm.setup("test")
    dm.setup("predict")
    assert len(dm.train_set) == len(dm.val_set) == len(dm.test_set) == 12
    assert [Path(n).name for n in dm.predict_names] == ["0.png", "1.png", "2.png"]
    x, idx = next(iter(dm.predict_dataloader()))
    assert x.shape == (3, 3, 32, 32) and idx.tolist() == [0, 1, 2]


def test_cache_is_reused_rebuilt_on_change_and_written_atomically(image_folder, tmp_path):
    (image_folder / "c0" / "broken.jpg").unlink()
    files = sorted(image_folder.rglob("*.[jp][pn]g"))
    cache_dir = tmp_path / "cache"
    first = ImageCache.load_or_build(files, 16, cache_dir)
    assert (
        sorted(p.name for p in cache_dir.iterdir() if p.name.startswith(".")) == []
    )  # no temporary files left
    stamp = {p: p.stat().st_mtime_ns for p in cache_dir.iterdir()}
    again = ImageCache.load_or_build(files, 16, cache_dir)
    assert {p: p.stat().st_mtime_ns for p in cache_dir.iterdir()} == stamp  # reused, not rewritten
    assert np.array_equal(first.images, again.images)
    # Editing one image (new content, new mtime) gives a new cache with the new pixels.
    Image.new("RGB", (16, 16), (255, 0, 0)).save(files[0])
    os.utime(files[0], ns=(1, 10**18))
    changed = ImageCache.load_or_build(files, 16, cache_dir)
    assert changed.images[0][0].min() >= 250 and not np.array_equal(changed.images[0], first.images[0])
    assert len(list(cache_dir.glob("*.npy"))) == 2


def test_interrupted_cache_build_leaves_nothing(image_folder, tmp_path, monkeypatch):
    import project.data.decoded_cache as decoded_cache

    (image_folder / "c0" / "broken.jpg").unlink()
    files = sorted(image_folder.rglob("*.[jp][pn]g"))

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(decoded_cache, "atomic_write_text", boom)
    with pytest.raises(KeyboardInterrupt):
        ImageCache.load_or_build(files, 16, tmp_path / "cache")
    # The array may be in place but without its json marker it is not taken as complete: a rebuild follows.
    monkeypatch.undo()
    assert not list((tmp_path / "cache").glob(".*"))
    ImageCache.load_or_build(files, 16, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1


def test_mean_std_matches_direct_computation(image_folder, tmp_path):
    shutil.rmtree(image_folder / "c1")
    (image_folder / "c0" / "broken.jpg").unlink()
    files = sorted(image_folder.rglob("*.[jp][pn]g"))
    cache = ImageCache.load_or_build(files, 16, tmp_path / "cache")
    idx = torch.tensor([0, 2, 3, 5])
    mean, std = cache.mean_std(idx)
    x = torch.from_numpy(np.asarray(cache.images)[idx.numpy()]).double() / 255
    assert np.allclose(mean, x.mean(dim=(0, 2, 3)).numpy()) and np.allclose(
        std, x.std(dim=(0, 2, 3), correction=0).numpy()
    )


def test_scan_finds_images_in_sorted_order_with_their_stamps(tmp_path):
    from project.data.image_reading import list_images, scan_class_folders

    names = [
        "b/2.png",
        "b/10.png",
        "a/x/1.jpg",
        "a/x.jpg",
        "a/.hidden.png",
        "a/notes.txt",
        "a/Z.PNG",
        ".cache/c.png",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4)).save(tmp_path / name, "PNG")
    expected = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix.lower() in (".png", ".jpg"))
    expected = [
        p for p in expected if not any(part.startswith(".") for part in p.relative_to(tmp_path).parts)
    ]
    assert list_images(tmp_path) == expected
    scan = scan_class_folders(tmp_path)
    assert scan.classes == ["a", "b"] and [Path(f) for f in scan.files] == expected
    assert scan.labels == [0, 0, 0, 1, 1]
    assert scan.stamps == [(p.stat().st_size, p.stat().st_mtime_ns) for p in expected]


@pytest.mark.slow
def test_building_the_image_cache_leaves_the_global_generator_alone(tmp_path):
    """A run that builds the cache must draw the same random numbers afterwards as one that finds it built."""
    from project.data.decoded_cache import ImageCache, sampled_mean_std
    from tests.fakes import make_image_folder

    files = [str(p) for p in sorted((make_image_folder(tmp_path / "images", extras=False)).rglob("*.*"))]
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ImageCache.load_or_build(files, 8, tmp_path / "cache", num_workers=2)
    sampled_mean_std(files, 8, tmp_path / "cache", num_workers=2)
    assert torch.equal(torch.rand(3), expected)


# -- bad data that used to end in a traceback or the wrong message -------------------------------------------------
def cli_error(args: list, capsys) -> str:
    """Run `python -m project` in-process, expect a clean failure, return its one error line."""
    from project.cli import main

    with pytest.raises(SystemExit):
        main([str(a) for a in args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def folder_fit(root: Path, tmp_path: Path, *extra) -> list:
    from tests.conftest import CONFIGS

    return ["fit", "--config", CONFIGS / "folder.yaml", "--data.root", root, "--data.cache_dir", tmp_path / "cache",
            "--trainer.default_root_dir", tmp_path / "logs", *extra]  # fmt: skip


def test_class_folders_that_differ_only_in_case_are_one_error(tmp_path, capsys):
    for name in ("Hat", "hat", "shoe"):
        (tmp_path / "ds" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "ds" / name / "a.png")
    message = cli_error(folder_fit(tmp_path / "ds", tmp_path), capsys)
    assert "class folders Hat and hat" in message and "differ only in case" in message


def test_a_validation_split_that_comes_out_empty_says_what_to_change(tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / "ds" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "ds" / name / "only.png")
    message = cli_error(folder_fit(tmp_path / "ds", tmp_path, "--data.val_fraction", "0.5"), capsys)
    assert "data.val_fraction=0.5 leaves no image to validate on" in message
    assert "give every class two images or more" in message and "validation split of its own" in message


@pytest.mark.parametrize("link", ["loop", "self.jpg"])
def test_a_symlink_loop_in_a_class_folder_is_named(tmp_path, capsys, link):
    root = make_two_classes(tmp_path / "ds")
    if link == "loop":
        (root / "a" / "loop").symlink_to("..")  # a folder that contains the class folder itself
    else:
        (root / "a" / "self.jpg").symlink_to("self.jpg")  # a link to itself: stat says ELOOP
    message = cli_error(folder_fit(root, tmp_path), capsys)
    assert str(root / "a" / link) in message, message


def make_two_classes(root: Path) -> Path:
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8)).save(root / name / f"{i}.png")
    return root


@pytest.mark.parametrize("size", ["-1", "0", "100000"])
def test_a_bad_image_size_blames_image_size_before_allocating_anything(tmp_path, capsys, size):
    message = cli_error(
        folder_fit(make_two_classes(tmp_path / "ds"), tmp_path, "--data.image_size", size), capsys
    )
    assert "data.image_size must be between 1 and 8192 pixels" in message and f"got {size}" in message
    assert "crop_padding" not in message


def test_tensor_dataset_keeps_float_targets_and_makes_lists_int64():
    from project.data.tensor_dataset import TensorImageDataset

    images = torch.zeros(3, 3, 2, 2, dtype=torch.uint8)
    multi_hot = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    _, y = TensorImageDataset(images, multi_hot).__getitems__([2, 0])
    assert y.dtype == torch.float32 and y.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    _, y = TensorImageDataset(images, [2, 0, 1]).__getitems__([0, 1])
    assert y.dtype == torch.int64 and y.tolist() == [2, 0]
