"""Real-world faults and bad inputs end in one clear line (or a 4xx from serve) and leave nothing corrupt or
mixed: decompression bombs, two runs in one folder, a run started otherwise, a full disk, a damaged image
cache, read-only outputs, an export folder that already holds an export, a failed download.

In-process where the process boundary does not matter; tests/test_faults.py kills real processes.
"""

import contextlib
import errno
import multiprocessing
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from project.data import CIFARDataModule, ImageFolderDataModule
from project.data.decoded_cache import ImageCache
from project.data.image_reading import ImageTooLarge, decode_image, open_image
from project.errors import UserError
from project.run.run_folder import claim_run_folder, lock_run_folder, release_run_folders
from tests.conftest import CONFIGS, ROOT, newest_run, run_cli
from tests.fakes import bomb_png
from tests.test_bad_input import fails
from tests.tiny_fit import tiny_args


def cifar_fit(data: Path, root: Path, *extra: object) -> list[str]:
    args = [
        "fit",
        "--config",
        str(CONFIGS / "cifar10.yaml"),
        *tiny_args(data, root),
        "--trainer.max_epochs",
        "1",
    ]
    return [*args, "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2", *map(str, extra)]


# -- decompression bombs ------------------------------------------------------------------------------------
def test_bombs_are_refused_before_they_are_decoded(tmp_path):
    huge = tmp_path / "huge.png"  # above twice PIL's limit: PIL's own DecompressionBombError
    huge.write_bytes(bomb_png(20_000, 20_000))
    large = tmp_path / "large.png"  # between the template's 40 Mpx and PIL's warning: the template's check
    large.write_bytes(bomb_png(8_000, 6_000))
    with pytest.raises(ImageTooLarge, match="declares 400,000,000 pixels, more than the limit of 40,000,000"):
        decode_image(huge, 32)
    with pytest.raises(ImageTooLarge, match="8000x6000 = 48,000,000 pixels"):
        open_image(large)
    assert open_image(large, max_pixels=50_000_000).size == (8_000, 6_000)  # the limit is a setting


@pytest.mark.parametrize("cache", [True, False])
def test_a_bomb_in_a_class_folder_is_named_or_left_out(image_folder, tmp_path, cache, capsys):
    (image_folder / "c0" / "broken.jpg").unlink()
    (image_folder / "c1" / "bomb.png").write_bytes(bomb_png())
    kwargs = {"image_size": 32, "cache": cache, "cache_dir": str(tmp_path / "cache"), "num_workers": 0}
    if cache:
        with pytest.raises(UserError, match=r"bomb\.png \(the image declares 400,000,000 pixels"):
            ImageFolderDataModule(str(image_folder), **kwargs).setup("fit")
    data = ImageFolderDataModule(str(image_folder), skip_corrupt=True, **kwargs)
    data.setup("fit")
    assert "warning: leaving out 1 unreadable image(s):" in capsys.readouterr().err
    assert len(data.train_set) + len(data.val_set) == 36


@pytest.mark.slow
def test_a_user_error_raised_in_a_dataloader_worker_is_its_own_line(image_folder, tmp_path, capsys):
    """A bad image met during `predict` in a worker process: PyTorch raises it again in the main process with the
    worker's traceback as its message; the CLI prints the one line."""
    (image_folder / "c0" / "broken.jpg").unlink()
    predict = tmp_path / "predict"
    predict.mkdir()
    (predict / "ok.png").write_bytes((image_folder / "c1" / "img0.jpg").read_bytes())
    (predict / "bomb.png").write_bytes(bomb_png())
    common = [
        "--config",
        CONFIGS / "folder.yaml",
        "--config",
        CONFIGS / "debug.yaml",
        "--model.net",
        "SimpleCNN",
    ]
    common += ["--data.root", image_folder, "--data.image_size", "32", "--data.cache_dir", tmp_path / "cache"]
    common += ["--trainer.default_root_dir", tmp_path / "logs"]
    assert_exit(0, ["fit", *common])
    ckpt = newest_run(tmp_path / "logs") / "checkpoints" / "last.ckpt"
    line = fails(
        ["predict", *common, "--ckpt_path", ckpt, "--data.predict_root", predict, "--data.num_workers", 1],
        capsys,
    )
    # Prediction lists every unreadable file, as training does.
    assert line.startswith("error: unreadable image file(s): ") and "bomb.png" in line
    assert "more than the limit of 40,000,000" in line


def assert_exit(code: int, args: list) -> None:
    from project.cli import main

    try:
        main([str(a) for a in args])
        exit_code = 0
    except SystemExit as e:
        exit_code = e.code
    assert exit_code == code


# -- run folders: one per run, one process at a time --------------------------------------------------------
def _claim(root: str) -> str:
    return claim_run_folder(root).name


@pytest.mark.slow
def test_runs_started_at_once_claim_different_folders(tmp_path):
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        names = pool.map(_claim, [str(tmp_path)] * 12)
    assert sorted(names, key=lambda n: int(n.split("_")[1])) == [f"version_{i}" for i in range(12)]


def test_a_run_that_is_running_cannot_be_written_by_another_process(tmp_path):
    run = tmp_path / "runs" / "version_0"
    code = f"from project.run.run_folder import lock_run_folder; from pathlib import Path; import sys, time; lock_run_folder(Path({str(run)!r})); print('locked', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=rf"the run in {run} is still running \(process {holder.pid} on "):
            lock_run_folder(run)
    finally:
        holder.kill()
        holder.wait()
    lock_run_folder(run)  # the kernel released the lock with the process
    release_run_folders()


def test_a_command_that_stops_at_a_bad_setting_leaves_no_run_folder(fake_cifar, tmp_path, capsys):
    line = fails([*cifar_fit(fake_cifar, tmp_path / "logs"), "--data.batch_size", "0"], capsys)
    assert "data.batch_size must be at least 1" in line and not (tmp_path / "logs").exists()


# -- --ckpt_path last: the right run -------------------------------------------------------------------------
def test_ckpt_path_last_passes_over_a_run_started_otherwise(fake_cifar, tmp_path, capsys):
    root = tmp_path / "logs"
    assert_exit(0, cifar_fit(fake_cifar, root))  # version_0: the real run
    assert_exit(
        0, [*cifar_fit(fake_cifar, root), "--trainer.limit_train_batches", "2"]
    )  # version_1: a debug run
    capsys.readouterr()
    assert_exit(0, [*cifar_fit(fake_cifar, root), "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    err = capsys.readouterr().err
    assert f"passing over the run in {root / 'runs' / 'version_1'}, started with other settings" in err
    assert "trainer.limit_train_batches: 2 there, 4 here" in err
    assert (
        torch.load(root / "runs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)[
            "global_step"
        ]
        == 8
    )
    assert sorted(p.name for p in (root / "runs").glob("version_*")) == [
        "version_0",
        "version_1",
    ]  # no new run


def test_continuing_a_run_that_has_finished_says_so(fake_cifar, tmp_path, capsys):
    root = tmp_path / "logs"
    assert_exit(0, cifar_fit(fake_cifar, root))
    assert_exit(0, [*cifar_fit(fake_cifar, root), "--ckpt_path", "last"])
    assert (
        "had already reached the end of its training (step 4); nothing was trained" in capsys.readouterr().err
    )


# -- a full disk ----------------------------------------------------------------------------------------------
def test_a_full_disk_is_named_and_the_previous_checkpoint_stays(fake_cifar, tmp_path, capsys, monkeypatch):
    import project.run.checkpoints as checkpoints

    saves, real_save = [], torch.save

    def save_until_full(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) > 2:  # torch's zip writer on ENOSPC
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1234 vs 1000")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "save", save_until_full)
    root = tmp_path / "logs"
    line = fails([*cifar_fit(fake_cifar, root), "--trainer.max_epochs", "2"], capsys)
    assert line.startswith("error: no space left on the device to write the checkpoint ")
    assert "the previous checkpoint there is intact" in line
    folder = newest_run(root) / "checkpoints"
    assert not [p for p in folder.parent.rglob(".*partial*")]  # nothing half-written
    monkeypatch.setattr(checkpoints.torch, "save", real_save)  # space again: the run continues from it
    assert_exit(0, [*cifar_fit(fake_cifar, root), "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 8


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, read_only: bool = False) -> Iterator[bool]:
    """A tmpfs of `size` (e.g. "64k") mounted at `folder` for the block: a disk that really is full, or
    read-only. Yields False where the machine allows no mount (not root): the caller patches the write then."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = not subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    ).returncode
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_while_caching_images_is_one_line_and_leaves_nothing(
    image_folder, tmp_path, capsys, monkeypatch
):
    disk = tmp_path / "disk"
    args = ["fit", "--config", CONFIGS / "folder.yaml", "--data.root", image_folder, "--data.skip_corrupt",
            "true", "--data.cache_dir", disk / "cache", "--model.net", "SimpleCNN", "--trainer.max_epochs", "1",
            "--trainer.logger", "false", "--trainer.default_root_dir", tmp_path / "logs"]  # fmt: skip
    with tmpfs(disk, "64k") as mounted:  # the cache of 36 images at 64 px takes 0.4 MB
        if mounted:  # a real process: a write through the memory map onto a full disk would kill it (SIGBUS)
            out = run_cli(*map(str, args), cwd=tmp_path, check=False)
            assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
            (line,) = [x for x in out.stderr.splitlines() if x.startswith("error:")]
        else:

            def no_room(fd: int, offset: int, length: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(os, "posix_fallocate", no_room)
            line = fails(args, capsys)
        assert line.startswith("error: no space left on the device to write the image cache ")
        assert line.endswith(
            "(0.4 MB); nothing was left there. Free some space, choose another folder with --data.cache_dir, "
            "or decode the images in the loader with --data.cache false"
        )
        assert [p for p in disk.rglob("*") if p.is_file()] == []  # no .partial cache file


# -- the image cache ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated array", "zeroed array", "truncated json"])
def test_a_damaged_cache_is_noticed_named_and_rebuilt(image_folder, tmp_path, damage, capsys):
    (image_folder / "c0" / "broken.jpg").unlink()
    files = sorted(image_folder.rglob("*.[jp][pn]g"))
    good = np.asarray(ImageCache.load_or_build(files, 16, tmp_path).images).copy()
    (array,) = tmp_path.glob("*.npy")
    (meta,) = tmp_path.glob("*.json")
    if damage == "truncated array":
        array.write_bytes(array.read_bytes()[:-100])
    elif damage == "zeroed array":  # same size, blank images: what a bad disk or copy can leave
        array.write_bytes(b"\0" * array.stat().st_size)
    else:
        meta.write_text(meta.read_text()[:20])
    capsys.readouterr()
    again = ImageCache.load_or_build(files, 16, tmp_path)
    assert f"warning: the image cache {array} is damaged (" in capsys.readouterr().err
    assert np.array_equal(np.asarray(again.images), good)
    ImageCache.load_or_build(files, 16, tmp_path)
    assert "damaged" not in capsys.readouterr().err  # rebuilt whole


# -- outputs that cannot be written, or already hold something ----------------------------------------------------
@pytest.fixture
def read_only_dir(tmp_path, monkeypatch) -> Path:
    """A folder nothing can be written into: a read-only tmpfs where the machine allows mounting one (as root,
    permissions alone do not stop writes), else a folder whose probe writes fail with EROFS."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        import project.atomic_files

        real = project.atomic_files.tempfile.TemporaryFile

        def refuse(*args, dir=None, **kwargs):
            if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
                raise OSError(errno.EROFS, "Read-only file system")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(project.atomic_files.tempfile, "TemporaryFile", refuse)
    yield folder
    if mounted.returncode == 0:
        subprocess.run(["umount", str(folder)], check=True)


def test_read_only_outputs_are_named_before_anything_runs(fake_cifar, image_folder, read_only_dir, capsys):
    with pytest.raises(UserError, match=r"data.cache_dir .* is not a writable folder .*--data.cache false"):
        ImageFolderDataModule(
            str(image_folder), cache_dir=str(read_only_dir / "cache"), skip_corrupt=True
        ).setup("fit")
    line = fails([*cifar_fit(fake_cifar, read_only_dir / "logs")], capsys)
    assert "trainer.default_root_dir" in line and "is not a writable folder" in line


def test_a_failed_download_leaves_no_data_folder(tmp_path, monkeypatch):
    from torchvision import datasets

    def no_network(self):  # as torchvision does: the folder first, then part of the archive, then the error
        Path(self.root).mkdir(parents=True, exist_ok=True)
        (Path(self.root) / "cifar-10-python.tar.gz").write_bytes(b"half an archive")
        raise URLError("Name or service not known")

    monkeypatch.setattr(datasets.CIFAR10, "download", no_network)
    with pytest.raises(UserError, match="download failed") as error:
        CIFARDataModule(data_dir=str(tmp_path / "new" / "data")).prepare_data()
    assert not (tmp_path / "new").exists()
    # It names the routes that need no network, and they exist.
    for config in re.findall(r"--config (configs/\S+\.yaml)", str(error.value)):
        assert (ROOT / config).is_file(), config
    assert "configs/sample.yaml" in str(error.value) and "--data.root" in str(error.value)
    # A folder the user made stays, without the partial archive.
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError, match="download failed"):
        CIFARDataModule(data_dir=str(tmp_path / "mine")).prepare_data()
    assert (tmp_path / "mine").is_dir() and not list((tmp_path / "mine").iterdir())
