"""`prepare` never loses what it did not write: a folder it did not make is refused (also with --overwrite), an
output that is, contains or lies inside the input is refused before anything is read, --overwrite is all or
nothing, a second prepare into the same folder is locked out, and a stop (SIGTERM, a full or read-only disk,
an index without chunks) is one line with nothing left behind. On a dozen generated images, as
tests/test_streaming.py prepares them.
"""

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from PIL import Image

from project.cli import main
from project.data import FileSource
from project.streaming import prepare_chunks
from project.streaming.source import METADATA
from tests.conftest import CONFIGS, subprocess_env
from tests.fakes import make_image_folder
from tests.test_hardening import tmpfs
from tests.test_streaming import fit_args, one_line_error, prepare_args

litdata = pytest.importorskip(
    "litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'"
)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) -> a digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def hidden_leftovers(folder: Path) -> list[str]:
    """The staging folders, old datasets and lock files prepare could leave in `folder`."""
    return sorted(p.name for p in folder.iterdir() if ".prepare" in p.name)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(
        tmp_path_factory.mktemp("safety") / "images", classes=2, per_class=6, extras=False
    )


def test_a_folder_prepare_did_not_make_is_never_written(images, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "train" / "keep.txt").write_text("mine")
    for extra in ([], ["--overwrite", "true"]):
        err = one_line_error(prepare_args(images, out, *extra), capsys)
        assert f"--output_dir {out} is not empty and holds no dataset made by prepare" in err
        assert "choose a new --output_dir" in err
    assert snapshot(out) == {"train/keep.txt": hashlib.sha256(b"mine").hexdigest()}
    foreign_metadata = (
        tmp_path / "other"
    )  # a streaming.json of another tool (no format of ours) is foreign too
    foreign_metadata.mkdir()
    (foreign_metadata / METADATA).write_text('{"splits": []}')
    err = one_line_error(prepare_args(images, foreign_metadata, "--overwrite", "true"), capsys)
    assert "holds no dataset made by prepare" in err and (foreign_metadata / METADATA).is_file()
    assert hidden_leftovers(tmp_path) == []


@pytest.fixture
def split_tree(tmp_path) -> Path:
    """`root/train/<class>` and `root/val/<class>`, the layout a user points both --data.root and
    --output_dir at."""
    root = tmp_path / "root"
    make_image_folder(root / "train", classes=2, per_class=4, extras=False)
    make_image_folder(root / "val", classes=2, per_class=2, extras=False, seed=1)
    return root


@pytest.mark.parametrize(
    ("where", "relation"), [(".", "is"), ("train/prepared", "lies inside"), ("..", "contains")]
)
def test_an_output_that_is_inside_or_around_the_input_is_refused_before_reading(
    split_tree, where, relation, capsys, monkeypatch
):
    before = snapshot(split_tree)
    import project.cli.config

    monkeypatch.setattr(
        project.cli.config, "build_datamodule", lambda config: pytest.fail("the input was read")
    )
    out = (split_tree / where).resolve()
    err = one_line_error(prepare_args(split_tree, out), capsys)
    assert (
        f"--output_dir {out} {relation} the input data.root {split_tree}: prepare never writes where it reads"
        in err
    )
    assert f"--output_dir {split_tree.parent / 'root_prepared'}" in err
    assert snapshot(split_tree) == before  # every source image intact, nothing added
    assert hidden_leftovers(split_tree.parent) == []


def test_an_output_in_a_csvs_folder_or_at_cifars_folder_is_refused(images, tmp_path, capsys):
    rows = [f"{p.relative_to(images)},{p.parent.name}" for p in sorted(images.glob("*/img*"))]
    (tmp_path / "labels.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    args = ["prepare", "--config", str(CONFIGS / "csv.yaml"), "--data.csv", str(tmp_path / "labels.csv"),
            "--data.images", str(images), "--output_dir", str(tmp_path / "prepared")]  # fmt: skip
    err = one_line_error(args, capsys)
    assert f"lies inside the input data.csv's folder {tmp_path}" in err
    args = ["prepare", "--config", str(CONFIGS / "cifar10.yaml"), "--data.download", "false",
            "--data.data_dir", str(tmp_path), "--output_dir", str(tmp_path / "cifar-10-batches-py")]  # fmt: skip
    err = one_line_error(args, capsys)
    assert f"is the input CIFAR's folder in data.data_dir {tmp_path / 'cifar-10-batches-py'}" in err
    assert not (tmp_path / "cifar-10-batches-py").exists()


class ListingSource(FileSource):
    """A user's source of image files, named by a setting prepare has no list of: `listing`, a file of paths."""

    def __init__(self, listing: str) -> None:
        self.listing = Path(listing)

    def scan(self, split, train):
        raise AssertionError("the input was read")


@pytest.mark.parametrize("source", ["ClassFolders", "ListingSource"])
def test_an_output_inside_the_folder_of_a_held_source_is_refused_before_reading(
    split_tree, source, tmp_path, capsys
):
    """A DataModule of image files holding a source (`data.source`): the folders the source's settings name are
    inputs too, the shipped ones' and a source of one's own alike."""
    listing = split_tree / "listing.csv"
    listing.write_text("train/c0/img0.png,c0\n")
    before = snapshot(split_tree)
    held = {
        "ClassFolders": {"class_path": "ClassFolders", "init_args": {"root": str(split_tree)}},
        "ListingSource": {"class_path": f"{__name__}.ListingSource", "init_args": {"listing": str(listing)}},
    }[source]
    config = tmp_path / "held.yaml"
    config.write_text(
        yaml.safe_dump({"data": {"class_path": "ImageFilesDataModule", "init_args": {"source": held}}})
    )
    out = split_tree / "train" / "prepared"
    args = [
        "prepare",
        "--config",
        str(CONFIGS / "folder.yaml"),
        "--config",
        str(config),
        "--output_dir",
        str(out),
    ]
    err = one_line_error(args, capsys)
    setting = "data.source.root" if source == "ClassFolders" else "data.source.listing's folder"
    assert f"--output_dir {out} lies inside the input {setting} {split_tree}: prepare never writes" in err
    assert snapshot(split_tree) == before and not out.exists()


@pytest.mark.slow
def test_an_overwrite_stopped_midway_leaves_the_old_dataset_whole(images, tmp_path, monkeypatch):
    out = tmp_path / "prepared"
    main(prepare_args(images, out))
    before = snapshot(out)
    optimize = litdata.optimize

    def interrupted_after_the_first_split(**kwargs) -> None:
        optimize(**kwargs)
        raise KeyboardInterrupt  # Ctrl-C (or a crash) once train is written, val not

    monkeypatch.setattr(litdata, "optimize", interrupted_after_the_first_split)
    with pytest.raises(KeyboardInterrupt):
        main(prepare_args(images, out, "--overwrite", "true", "--num_folds", "null"))
    assert snapshot(out) == before and hidden_leftovers(tmp_path) == []
    monkeypatch.undo()
    main(prepare_args(images, out, "--overwrite", "true", "--num_folds", "null"))
    assert json.loads((out / METADATA).read_text())["folds"] is None  # replaced, whole
    assert hidden_leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_second_prepare_into_the_same_folder_is_locked_out(images, tmp_path, capsys):
    out = tmp_path / "prepared"
    lock = tmp_path / ".prepared.prepare.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"{holder.pid}\n")  # as a prepare running in that process holds it
        err = one_line_error(prepare_args(images, out), capsys)
        assert (
            f"--output_dir {out} is being written by another prepare (process {holder.pid}, lock file {lock})"
            in err
        )
        assert not out.exists() and lock.read_text() == f"{holder.pid}\n"
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed outright: its lock and its staging folder are stale and go; a folder named like a
    # staging folder but without prepare's marker is not prepare's to remove.
    stale = tmp_path / f".prepared.prepare-{holder.pid}"
    (stale / "train").mkdir(parents=True)
    (stale / ".prepare-incomplete").touch()
    lookalike = tmp_path / f".prepared.prepare-{holder.pid + 1}"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("not prepare's")
    main(prepare_args(images, out))
    assert json.loads((out / METADATA).read_text())["splits"] == {"train": 10, "val": 2}
    assert hidden_leftovers(tmp_path) == [lookalike.name]


@pytest.mark.slow
def test_each_prepare_has_litdata_working_folders_of_its_own(images, tmp_path, monkeypatch):
    # litdata's optimize empties its working folders as it starts, by default the same ones for every prepare on
    # the machine: a second prepare would delete the chunks a first one has not uploaded yet.
    from litdata.processing import data_processor

    optimize, seen = litdata.optimize, []

    def recording(**kwargs) -> None:
        seen.append((data_processor._get_cache_dir(), data_processor._get_cache_data_dir()))
        optimize(**kwargs)

    monkeypatch.setattr(litdata, "optimize", recording)
    monkeypatch.delenv("DATA_OPTIMIZER_CACHE_FOLDER", raising=False)
    shared = (data_processor._get_cache_dir(), data_processor._get_cache_data_dir())
    main(prepare_args(images, tmp_path / "prepared"))
    assert len(seen) == 2 and seen[0] == seen[1]  # train, then val
    assert not set(seen[0]) & set(shared) and Path(seen[0][0]).parent.name.startswith(".prepare-litdata-")
    assert not [f for f in seen[0] if Path(f).parent.exists()]  # removed after it
    assert (data_processor._get_cache_dir(), data_processor._get_cache_data_dir()) == shared


@pytest.mark.parametrize("chunk_bytes", ["0", "0MB", "-5", "lots"])
def test_a_chunk_size_below_one_byte_is_refused_before_anything_is_created(
    images, tmp_path, capsys, chunk_bytes
):
    out = tmp_path / "new" / "prepared"
    err = one_line_error(prepare_args(images, out, "--chunk_bytes", chunk_bytes), capsys)
    assert (
        f"--chunk_bytes must be a size of at least 1 byte, such as 64MB, 500KB or 1000000, got {chunk_bytes!r}"
        in err
    )
    assert list(tmp_path.iterdir()) == []


#: The one line of every writer for a full disk, here for prepare's output.
FULL = (
    "error: no space left on the device to write --output_dir {out}{at}; nothing was written there. Free some "
    "space, or choose another --output_dir"
)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "No space left on device"),
        (errno.EROFS, "Read-only file system"),
        (errno.EACCES, "Permission denied"),
    ],
)
def test_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(
    images, tmp_path, capsys, monkeypatch, code, reason
):
    def failing_write(**kwargs) -> None:
        raise OSError(code, os.strerror(code), f"{kwargs['output_dir']}/chunk-0-0.bin")

    monkeypatch.setattr(litdata, "optimize", failing_write)
    out = tmp_path / "new" / "prepared"
    err = one_line_error(prepare_args(images, out), capsys)
    if code == errno.ENOSPC:
        staged = tmp_path / "new" / f".prepared.prepare-{os.getpid()}" / "train" / "chunk-0-0.bin"
        assert err == FULL.format(out=out, at=f" ({staged})")
    else:
        assert f"cannot write --output_dir {out}: {reason} (" in err
        assert err.endswith("nothing was written there")
    assert list(tmp_path.iterdir()) == []  # not even the parent folders it would have created


# 36 images prepared take 7 pages of a tmpfs, their training chunk 6: a disk of 7 pages is full at the first
# chunk, one of 10 (the lock file's page and the chunk's) after it, where litdata's writer fails unsaid.
@pytest.mark.parametrize("size", ["28k", "40k"])
@pytest.mark.slow
def test_prepare_onto_a_disk_that_fills_up_is_the_full_disk_line_and_leaves_nothing(
    tmp_path, capsys, monkeypatch, size
):
    images = make_image_folder(tmp_path / "images", classes=3, per_class=12, extras=False)
    disk = tmp_path / "disk"
    with tmpfs(disk, size) as mounted:
        if not mounted:  # as litdata on a full disk: its writer failed unsaid, an empty index was read back

            def empty_index(**kwargs) -> None:
                raise json.JSONDecodeError("Expecting value", "", 0)

            monkeypatch.setattr(litdata, "optimize", empty_index)
            monkeypatch.setattr(prepare_chunks.shutil, "disk_usage", lambda path: SimpleNamespace(free=0))
        err = one_line_error(prepare_args(images, disk / "prepared"), capsys)
        head, tail = FULL.format(out=disk / "prepared", at="@").split("@")
        assert err.startswith(head) and err.endswith(tail), err  # with the file it was writing, if known
        assert list(disk.iterdir()) == []  # no staging folder, no lock


def test_prepare_onto_a_read_only_disk_is_one_line_naming_it(images, tmp_path, capsys):
    disk = tmp_path / "disk"
    with tmpfs(disk, "1m", read_only=True) as mounted:
        if not mounted:  # not root: a folder without write permission stops the writes as well
            disk.chmod(0o555)
        try:
            err = one_line_error(prepare_args(images, disk / "prepared"), capsys)
        finally:
            if not mounted:
                disk.chmod(0o755)
        reason = "Read-only file system" if mounted else "Permission denied"
        assert err == (
            f"error: cannot write --output_dir {disk / 'prepared'}: {reason} ({disk / '.prepared.prepare.lock'}); "
            "nothing was written there"
        )
        assert list(disk.iterdir()) == []


def no_space_left(item) -> dict:
    """encode_sample on a full disk, in litdata's worker process."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/chunk-0-0.bin")


@pytest.mark.slow
def test_a_full_disk_in_a_worker_process_is_one_line_and_leaves_nothing(
    images, tmp_path, capsys, monkeypatch
):
    import psutil

    monkeypatch.setattr(prepare_chunks, "encode_sample", no_space_left)
    out = tmp_path / "prepared"
    # Only the processes prepare starts: earlier tests in this pytest process may have left their own (a
    # compile worker pool, a W&B service) running.
    before = {p.pid for p in psutil.Process().children()}
    err = one_line_error(prepare_args(images, out, "--num_workers", "2"), capsys)
    assert err == FULL.format(out=out, at=" (/data/chunk-0-0.bin)")
    assert not out.exists() and hidden_leftovers(tmp_path) == []
    started = [p for p in psutil.Process().children() if p.pid not in before]
    workers = [p for p in started if "resource_tracker" not in " ".join(p.cmdline())]
    assert [p for p in workers if p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a read-only folder; the sibling test above covers it"
)
def test_a_read_only_parent_folder_is_one_line(images, tmp_path, capsys):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        err = one_line_error(prepare_args(images, parent / "prepared"), capsys)
    finally:
        parent.chmod(0o755)
    assert f"cannot write --output_dir {parent / 'prepared'}: Permission denied" in err
    assert list(parent.iterdir()) == []


@pytest.mark.slow
def test_a_split_whose_index_lists_no_chunk_is_never_marked_complete(images, tmp_path, capsys, monkeypatch):
    optimize = litdata.optimize

    def losing_every_chunk(**kwargs) -> None:  # as two prepares removing each other's splits did
        optimize(**kwargs)
        index = Path(kwargs["output_dir"]) / "index.json"
        index.write_text(json.dumps({**json.loads(index.read_text()), "chunks": []}))

    monkeypatch.setattr(litdata, "optimize", losing_every_chunk)
    out = tmp_path / "prepared"
    err = one_line_error(prepare_args(images, out), capsys)
    assert (
        f"prepare of {out}/train did not finish: its index lists no chunk; {METADATA} was not written" in err
    )
    assert not out.exists() and hidden_leftovers(tmp_path) == []


def test_passwords_in_s3_urls_are_never_echoed(tmp_path, capsys):
    url = "s3://alice:S3CRET@bucket/prepared"
    err = one_line_error(["prepare", "--config", str(CONFIGS / "folder.yaml"), "--data.root", str(tmp_path),
                          "--output_dir", url], capsys)  # fmt: skip
    assert (
        "S3CRET" not in err
        and "--output_dir s3://alice:***@bucket/prepared: an s3:// URL takes no user" in err
    )
    err = one_line_error(fit_args(url, tmp_path), capsys)
    assert "S3CRET" not in err and "data.input_dir s3://alice:***@bucket/prepared" in err


def test_an_overwrite_of_a_bucket_prefix_prepare_did_not_make_is_refused(images, tmp_path, capsys):
    import boto3

    from tests.s3_server import s3_server

    (tmp_path / "s3").mkdir()
    with s3_server(tmp_path / "s3"):
        boto3.client("s3").put_object(Bucket="bucket", Key="theirs/keep.txt", Body=b"mine")
        args = prepare_args(images, tmp_path / "unused", "--overwrite", "true")
        args[args.index("--output_dir") + 1] = "s3://bucket/theirs"
        err = one_line_error(args, capsys)
        assert "--output_dir s3://bucket/theirs is not empty and holds no dataset made by prepare" in err
        listed = boto3.client("s3").list_objects_v2(Bucket="bucket")["Contents"]
        assert [item["Key"] for item in listed] == ["theirs/keep.txt"]


def write_slow_images(root: Path, per_class: int) -> None:
    """Noise PNGs (slow to decode), so that a prepare of them is still encoding when a test stops it."""
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(
                root / f"c{c}" / f"{i}.png"
            )


@pytest.mark.slow
def test_sigterm_from_outside_stops_prepare_in_one_line_and_leaves_nothing(tmp_path):
    import psutil

    images = tmp_path / "images"
    write_slow_images(images, per_class=40)
    out = tmp_path / "prepared"
    args = prepare_args(images, out, "--num_workers", "2")
    proc = subprocess.Popen([sys.executable, "-m", "project", *args], env=subprocess_env(), stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        main_process = psutil.Process(proc.pid)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            workers = main_process.children(recursive=True)
            if len(workers) >= 2 and hidden_leftovers(
                tmp_path
            ):  # the staging folder, and its encoders at work
                break
            time.sleep(0.05)
        assert proc.poll() is None, "prepare ended before the test could stop it"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM
    lines = stderr.strip().splitlines()
    assert lines == [f"error: stopped by SIGTERM; prepare left --output_dir {out} as it was"], stderr
    assert not out.exists() and hidden_leftovers(tmp_path) == []
    _, alive = psutil.wait_procs(workers, timeout=10)  # the workers and multiprocessing's resource tracker
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
