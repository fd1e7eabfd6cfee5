"""Streaming with litdata: `prepare` converts image files and CIFAR into chunks with stratified folds,
`StreamingImageDataModule` trains from them (and from a fold of them), a run stopped mid-epoch resumes exactly,
two DDP processes read disjoint shards, and bad inputs are one line. All on a dozen generated images in local
folders; object storage is tests/test_streaming_s3.py.
"""

import json
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from project.cli import main
from project.data.augment import BatchAugmentation
from project.data.cifar import CIFARDataModule
from project.data.datamodule import ImageDataModule, LabelledSplits
from project.data.image_reading import MAX_IMAGE_PIXELS
from project.errors import UserError
from project.streaming.source import METADATA, StreamingImageDataModule
from tests.conftest import CONFIGS, run_cli
from tests.fakes import CIFAR10_CLASSES, make_fake_cifar, make_image_folder, patch_cifar_integrity
from tests.test_exact_resume import assert_same_weights, last_weights

pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")


def prepare_args(images: Path, out: Path, *extra: object) -> list[str]:
    args = ["prepare", "--config", CONFIGS / "folder.yaml", "--data.root", images]
    args += [
        "--data.cache_dir",
        out.parent / "cache",
        "--output_dir",
        out,
        "--size",
        "16",
        "--num_workers",
        "1",
    ]
    return [str(a) for a in [*args, *extra]]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Two classes of six images (PNG and JPEG, mixed sizes and modes) prepared: train 10, val 2."""
    root = tmp_path_factory.mktemp("streaming")
    images = make_image_folder(root / "images", classes=2, per_class=6, extras=False)
    main(prepare_args(images, root / "prepared"))
    return root / "prepared"


def fit_args(input_dir: Path | str, root: Path, *extra: object) -> list[str]:
    args = [
        "fit", "--config", CONFIGS / "streaming.yaml", "--data.input_dir", input_dir,
        "--data.image_size", "8", "--data.batch_size", "2", "--data.num_workers", "0", "--data.augment.cutout", "2",
        "--model.net", "project.models.SimpleCNN", "--model.net.init_args.width", "4", "--model.scheduler", "null",
        "--trainer.precision", "32-true", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", root,
    ]  # fmt: skip
    return [str(a) for a in [*args, *extra]]


@pytest.mark.slow
def test_prepare_writes_splits_and_metadata(prepared):
    meta = json.loads((prepared / METADATA).read_text())
    assert meta["classes"] == ["c0", "c1"] and meta["targets"] == "classes"
    assert meta["splits"] == {"train": 10, "val": 2}
    assert all(0 < m < 1 for m in meta["mean"]) and all(0 < s < 1 for s in meta["std"])
    data = StreamingImageDataModule(str(prepared), image_size=8, batch_size=4, num_workers=0)
    data.setup("fit")
    images, targets = next(iter(data.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 8, 8)
    assert targets.dtype == torch.int64 and set(targets.tolist()) <= {0, 1}
    seen = [int(y) for _, y in (data.train_set[i] for i in range(10))]  # pyright: ignore[reportOptionalSubscript]
    assert sorted(seen) == [0] * 5 + [1] * 5  # every training image once, its label with it


@pytest.mark.slow
def test_testing_a_dataset_without_a_test_split_says_which_split_it_scored(prepared, capsys):
    data = StreamingImageDataModule(str(prepared), image_size=8, batch_size=4, num_workers=0)
    data.setup("test")
    assert data.tested_split == "validation" and len(data.test_set) == 2  # pyright: ignore[reportArgumentType]
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "test split" in line]
    assert line.startswith("warning: the dataset has no test split: testing on the validation split")


@pytest.mark.slow
def test_prepare_fit_predict_through_the_cli(prepared, tmp_path):
    main(fit_args(prepared, tmp_path, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"))
    (ckpt,) = tmp_path.glob("runs/version_*/checkpoints/last.ckpt")
    predict = fit_args(prepared, tmp_path, "--ckpt_path", ckpt)
    main(["predict", *predict[1:]])
    (written,) = tmp_path.glob("runs/version_*/predictions.csv")
    rows = written.read_text().splitlines()
    assert rows[0].startswith("input,class_index,class_name") and [r.split(",")[0] for r in rows[1:]] == [
        "val/0",
        "val/1",
    ]  # no test split: the validation split, each image named by its place in it


def test_prepare_of_a_missing_folder_or_cifar_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    err = one_line_error(prepare_args(missing, tmp_path / "out"), capsys)
    assert f"data.root {missing} does not exist" in err
    args = ["prepare", "--config", str(CONFIGS / "cifar10.yaml"), "--data.download", "false"]
    args += ["--data.data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    err = one_line_error(args, capsys)
    assert f"cifar10 is not in {tmp_path}" in err and "cifar-10-python.tar.gz" in err
    assert not (tmp_path / "out").exists()


class InMemorySource(ImageDataModule):
    """A user's own source, as the README's "Add a dataset" has one write it: images made in memory, listed
    split by split by `labelled_splits`, which is all `prepare` asks of a source."""

    @property
    def class_names(self) -> list[str]:
        return ["dark", "light"]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, 8, 8)

    def labelled_splits(self) -> LabelledSplits:
        def split(n: int) -> tuple[list, list]:
            labels = [i % 2 for i in range(n)]
            return [np.full((8, 12, 3), 40 + 160 * y, np.uint8) for y in labels], labels

        splits = {"train": split(6), "val": split(2)}
        return LabelledSplits(
            self.class_names, self.targets, splits, MAX_IMAGE_PIXELS, 8, self.seed, "InMemory"
        )


@pytest.mark.slow
def test_prepare_reads_any_source_that_lists_its_samples_and_only_those(tmp_path, capsys):
    out = tmp_path / "prepared"
    args = ["prepare", "--data", f"{__name__}.InMemorySource", "--model.net", "project.models.SimpleCNN"]
    main([*args, "--output_dir", str(out), "--num_workers", "1", "--num_folds", "2"])
    meta = json.loads((out / METADATA).read_text())
    assert meta["classes"] == ["dark", "light"] and meta["splits"] == {"train": 6, "val": 2}
    assert meta["source"] == "InMemory" and meta["folds"]["sizes"] == [3, 3]
    data = StreamingImageDataModule(str(out), image_size=8, batch_size=6, num_workers=0)
    data.setup("fit")
    images, targets = next(iter(data.train_dataloader()))
    # each image its label's shade (JPEG keeps a flat image within a few levels)
    assert all(
        abs(int(x.float().mean()) - (40 + 160 * int(y))) < 8 for x, y in zip(images, targets, strict=True)
    )

    # A source that cannot list its samples (here: chunks already prepared) is one line naming what it lacks.
    args = ["prepare", "--config", str(CONFIGS / "streaming.yaml"), "--data.input_dir", str(out)]
    err = one_line_error([*args, "--output_dir", str(tmp_path / "again")], capsys)
    assert "StreamingImageDataModule does not list its samples: give it a labelled_splits() method" in err
    assert not (tmp_path / "again").exists()


@pytest.mark.slow
def test_prepare_cifar_from_torchvision_files_and_fit(tmp_path):
    patch_cifar_integrity()
    make_fake_cifar(tmp_path / "cifar", per_batch=4, n_test=3)  # 20 training images, 3 test images
    out = tmp_path / "prepared"
    main(["prepare", "--config", str(CONFIGS / "cifar10.yaml"), "--data.data_dir", str(tmp_path / "cifar"),
          "--data.download", "false", "--data.val_size", "4", "--output_dir", str(out), "--num_workers", "1",
          "--num_folds", "null"])  # fmt: skip
    meta = json.loads((out / METADATA).read_text())
    assert meta["classes"] == CIFAR10_CLASSES and meta["source"] == "CIFARDataModule"
    assert meta["splits"] == {"train": 16, "val": 4, "test": 3} and meta["folds"] is None
    # The same images and labels as CIFARDataModule's own split, up to JPEG: each stored image is its
    # CIFAR image at 32 px (never enlarged), under the label torchvision reads.
    cifar = CIFARDataModule(data_dir=str(tmp_path / "cifar"), download=False, val_size=4)
    cifar.setup("fit")
    assert cifar.val_set is not None
    data = StreamingImageDataModule(str(out), image_size=32, num_workers=0)
    data.setup("fit")
    assert data.val_set is not None
    rows = cifar.val_set.indices.tolist()
    originals = [cifar.val_set.images[r].int() for r in rows]
    for k, row in enumerate(rows):  # the validation split is stored in its own order
        image, label = data.val_set[k]
        errors = [(image.int() - o).abs().float().mean().item() for o in originals]
        assert min(range(4), key=errors.__getitem__) == k and label == int(cifar.val_set.targets[row])  # pyright: ignore[reportOptionalSubscript]
    main(fit_args(out, tmp_path, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"))
    assert list(tmp_path.glob("runs/version_*/checkpoints/last.ckpt"))


@pytest.mark.slow
def test_prepare_refuses_a_complete_dataset_without_overwrite(prepared, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(prepare_args(prepared.parent / "images", prepared))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds a prepared dataset" in err and "--overwrite" in err


def one_line_error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.count("\n") == 0, err
    return err


@pytest.mark.slow
def test_missing_foreign_or_interrupted_input_dir_is_one_line(prepared, tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert f"data.input_dir {missing} does not exist" in one_line_error(fit_args(missing, tmp_path), capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    err = one_line_error(fit_args(empty, tmp_path), capsys)
    assert f"has no {METADATA}: not a dataset made by `python -m project prepare`" in err
    # An image tree: the message names a prepare FROM it INTO a new folder, never into the tree itself.
    images = make_image_folder(tmp_path / "images", classes=2, per_class=6, extras=False)
    err = one_line_error(fit_args(images, tmp_path), capsys)
    new = tmp_path / "images_prepared"
    assert f"data.input_dir {images} holds image files, not a dataset" in err
    assert f"--data.root {images} --output_dir {new}, then fit with --data.input_dir {new}" in err
    sources = sorted(p for p in images.rglob("*") if p.is_file())
    main(prepare_args(images, new))  # the command it names, as the test's other prepares run it
    assert json.loads((new / METADATA).read_text())["splits"] == {"train": 10, "val": 2}
    assert sorted(p for p in images.rglob("*") if p.is_file()) == sources
    interrupted = tmp_path / "interrupted"  # litdata's splits, no metadata: not a folder prepare now leaves
    (interrupted / "train").mkdir(parents=True)
    for name in ("index.json", "chunk-0-0.bin"):
        (interrupted / "train" / name).write_bytes((prepared / "train" / name).read_bytes())
    err = one_line_error(fit_args(interrupted, tmp_path), capsys)
    assert "litdata chunks without the metadata prepare writes last" in err
    assert f"--output_dir {tmp_path / 'interrupted_prepared'})" in err
    err = one_line_error(prepare_args(prepared.parent / "images", interrupted), capsys)
    assert "is not empty and holds no dataset made by prepare" in err  # not ours to replace
    assert (interrupted / "train" / "chunk-0-0.bin").is_file()


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_exactly(prepared, tmp_path, workers):
    # 10 training images in batches of 2: 5 steps an epoch; the stop comes at the 2nd step of the 2nd epoch.
    # In the main process, the epoch after the resumed one must not come out empty; through a worker, the
    # position must count the batches handed out, not those the worker read ahead.
    run = [
        "--trainer.max_epochs",
        "3",
        "--trainer.limit_val_batches",
        "1",
        "--data.num_workers",
        str(workers),
    ]
    stop = ["--trainer.callbacks+=tests.test_exact_resume.TermAfterStep", "--trainer.callbacks.step", "7"]
    main(fit_args(prepared, tmp_path / "whole", *run))
    stopped = fit_args(prepared, tmp_path / "stopped", *run, *stop)
    with pytest.raises(SystemExit) as exit_info:
        main(stopped)
    assert exit_info.value.code == 128 + signal.SIGTERM
    main([*stopped, "--ckpt_path", "last"])
    assert_same_weights(last_weights(tmp_path / "stopped"), last_weights(tmp_path / "whole"))


class RecordImages(L.Callback):
    """Writes, per process, each training image's pixel sum and its epoch to `path`.rank<N> (JSON lines): with
    augmentation off, the sum tells the images apart."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int
    ) -> None:
        sums = [round(v, 3) for v in batch[0].flatten(1).double().sum(1).tolist()]
        with open(f"{self.path}.rank{trainer.global_rank}", "a") as f:
            f.write(json.dumps([trainer.current_epoch, sums]) + "\n")


def seen_images(path: Path, rank: int) -> dict[int, list[float]]:
    """epoch -> the images (pixel sums) process `rank` trained on, in order."""
    seen: dict[int, list[float]] = {}
    for line in Path(f"{path}.rank{rank}").read_text().splitlines():
        epoch, sums = json.loads(line)
        seen.setdefault(epoch, []).extend(sums)
    return seen


@pytest.mark.slow
def test_two_ddp_processes_read_disjoint_shards_covering_the_data(prepared, tmp_path):
    record = ["--trainer.callbacks+=tests.test_streaming.RecordImages", "--trainer.callbacks.path"]
    plain = [
        "--data.batch_size",
        "1",
        "--data.augment.cutout",
        "0",
        "--data.augment.flip",
        "false",
        "--data.augment.crop_padding",
        "0",
    ]
    plain += ["--trainer.max_epochs", "2", "--trainer.limit_val_batches", "1"]
    main(fit_args(prepared, tmp_path / "one", *plain, *record, str(tmp_path / "one")))
    ddp = ["--config", str(CONFIGS / "trainer" / "ddp_cpu.yaml")]
    run_cli(*fit_args(prepared, tmp_path / "two", *plain, *ddp, *record, str(tmp_path / "two")), cwd=tmp_path)
    every_image = seen_images(tmp_path / "one", 0)[0]
    assert len(set(every_image)) == 10  # the ten training images, told apart by their sums
    for epoch in (0, 1):
        rank0, rank1 = seen_images(tmp_path / "two", 0)[epoch], seen_images(tmp_path / "two", 1)[epoch]
        assert len(rank0) == len(rank1) == 5
        assert not set(rank0) & set(rank1)
        assert sorted(rank0 + rank1) == sorted(every_image)


@pytest.mark.slow
def test_a_prepare_whose_chunks_did_not_all_arrive_writes_no_metadata(
    prepared, tmp_path, capsys, monkeypatch
):
    import litdata

    optimize = litdata.optimize

    def losing_a_chunk(
        **kwargs,
    ) -> None:  # as a writer or uploader process that died without optimize raising
        optimize(**kwargs)
        next(Path(kwargs["output_dir"]).glob("chunk-*.bin")).unlink()

    monkeypatch.setattr(litdata, "optimize", losing_a_chunk)
    out = tmp_path / "lost"
    err = one_line_error(prepare_args(prepared.parent / "images", out), capsys)
    assert f"prepare of {out}/train did not finish: 1 of its 1 chunks are missing (chunk-0-0.bin" in err
    assert not (out / METADATA).exists()
    monkeypatch.undo()  # and, as the message says, a new prepare completes it
    main(prepare_args(prepared.parent / "images", out))
    assert json.loads((out / METADATA).read_text())["splits"] == {"train": 10, "val": 2}


def test_a_larger_decode_size_is_cropped_on_the_device_for_training_and_resized_for_evaluation(
    prepared, tmp_path
):
    data = StreamingImageDataModule(
        str(prepared),
        image_size=8,
        decode_size=16,
        augment=BatchAugmentation(crop_scale=(0.25, 1.0)),
        batch_size=4,
        num_workers=0,
    )
    data.setup("fit")
    images, _ = next(iter(data.train_dataloader()))
    assert images.shape == (4, 3, 16, 16)  # the workers decode at the source resolution
    for train in (True, False):
        x = data.augment.images(images, None, train=train, epoch=0, size=(8, 8), seed=0)
        assert x.shape == (4, 3, 8, 8)
    main(fit_args(prepared, tmp_path, "--data.decode_size", "16", "--data.augment.crop_scale", "[0.25, 1.0]",
                  "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"))  # fmt: skip
    assert list(tmp_path.glob("runs/version_*/checkpoints/last.ckpt"))
    with pytest.raises(UserError, match="data.decode_size must be at least image_size=8, got 4"):
        StreamingImageDataModule(str(prepared), image_size=8, decode_size=4)


def test_a_split_smaller_than_processes_times_batch_size_is_one_line(prepared):
    from types import SimpleNamespace

    data = StreamingImageDataModule(str(prepared), image_size=8, batch_size=2, num_workers=0)
    data.trainer = SimpleNamespace(world_size=2, global_rank=0, accumulate_grad_batches=1)  # pyright: ignore[reportAttributeAccessIssue]
    with pytest.raises(
        UserError, match=r"the val split of .* has 2 images, fewer than 2 processes x data.batch_size 2"
    ):
        data.setup("fit")
    data.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1)  # pyright: ignore[reportAttributeAccessIssue]
    data.setup("fit")  # one process takes every batch


@pytest.mark.slow
def test_streaming_fit_and_predict_say_only_what_applies(tmp_path):
    pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")
    images = make_image_folder(tmp_path / "images", classes=2, per_class=6, extras=False)
    prepared = tmp_path / "prepared"
    main([str(a) for a in ["prepare", "--config", CONFIGS / "folder.yaml", "--data.root", images, "--data.cache_dir",
                           tmp_path / "cache", "--output_dir", prepared, "--size", "16", "--num_workers", "1"]])  # fmt: skip
    args = [
        "--config", CONFIGS / "streaming.yaml", "--data.input_dir", prepared, "--data.image_size", "8",
        "--data.batch_size", "2", "--data.num_workers", "2", "--model.net", "SimpleCNN",
        "--model.net.init_args.width", "4", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", tmp_path / "logs",
    ]  # fmt: skip
    fit = run_cli("fit", *map(str, args), "--trainer.max_steps", "2", cwd=tmp_path)
    (ckpt,) = (tmp_path / "logs").rglob("last.ckpt")
    predict = run_cli("predict", *map(str, args), "--ckpt_path", str(ckpt), cwd=tmp_path)
    for run in (fit, predict):  # litdata gives each worker its own chunks; predictions carry their index
        assert "IterableDataset" not in run.stderr and "Couldn't infer the batch indices" not in run.stderr
    said = [line for line in predict.stderr.splitlines() if "predict_split" in line]
    assert len(said) == 1 and said[0].startswith(
        "warning: no data.predict_split given: predicting the val split"
    )
    assert "named val/<place in the split>" in said[0]


def _cut_short(folder: Path) -> None:
    chunk = folder / "train" / "chunk-0-0.bin"
    chunk.write_bytes(chunk.read_bytes()[:100])


def _edit(**entries):
    def edit(folder: Path) -> None:
        meta = json.loads((folder / METADATA).read_text())
        (folder / METADATA).write_text(json.dumps({**meta, **entries}))

    return edit


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_cut_short, "the chunk train/chunk-0-0.bin has 100 bytes, its index.json records "),
        (lambda f: (f / "train" / "chunk-0-0.bin").unlink(), "the chunk train/chunk-0-0.bin is missing"),
        (lambda f: (f / "val" / "index.json").unlink(), "val/index.json is missing"),
        (_edit(classes="c0 c1"), "streaming.json 'classes' must be a list of names, got c0 c1"),
        (_edit(classes=["c0", "c0"]), "streaming.json 'classes' names 'c0' twice"),
        (_edit(splits={"train": 99, "val": 2}, folds=None), "streaming.json says the train split holds 99 images, its index.json 10"),
        (_edit(folds={"seed": 0, "sizes": [1, 1]}), "streaming.json 'folds' sizes add up to 2 images, the train split holds 10"),
        (_edit(mean="0.5"), "streaming.json 'mean' and 'std' must be three numbers each (std above 0)"),
        (_edit(splits={"train": 10}), "streaming.json 'splits' has no val images"),
    ],
    ids=["chunk cut short", "chunk deleted", "index deleted", "classes a string", "a class twice",
         "split size", "fold sizes", "mean", "no val split"],
)  # fmt: skip
def test_a_damaged_or_hand_edited_dataset_is_one_line_before_the_fit(
    prepared, tmp_path, capsys, damage, says
):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    damage(copy)
    err = one_line_error(fit_args(copy, tmp_path / "logs"), capsys)
    assert err.startswith(f"error: {copy}: {says}") and err.endswith(
        "; the prepared dataset was edited or damaged: prepare it again (python -m project prepare ... --overwrite true)"
    )
    assert not (tmp_path / "logs").exists()  # stopped before the run began


def test_a_target_outside_the_names_of_the_metadata_is_one_line_naming_the_image(prepared):
    # streaming.json edited to fewer classes (or tags) than the chunks hold: without the check, an IndexError in
    # the loss in the middle of training. Checked where each sample is decoded, in the loader workers.
    from litdata import StreamingDataset

    from project.streaming.source import DecodeSample

    data = StreamingImageDataModule(str(prepared), image_size=8, num_workers=0)
    data.setup("fit")
    (own,) = [t for t in data.val_set.transform if isinstance(t, DecodeSample)]  # pyright: ignore[reportOptionalMemberAccess]
    assert own.names == 2 and own.split == f"{prepared}/val"
    stored = StreamingDataset(str(prepared / "val"))[0]
    for names, target, held in [
        (1, 1, "class number 1"),
        (3, np.ones(2, dtype=np.uint8), "a target row of 2"),
    ]:
        decode = DecodeSample(8, names=names, noun="class", split=f"{prepared}/val")
        with pytest.raises(UserError) as error:
            decode({**stored, "target": target})
        assert str(error.value) == (
            f"{prepared}/val: image {stored['index']} holds {held}, but {METADATA} names {names} classes: it was "
            "edited, or belongs to another dataset; prepare the images again"
        )
    assert decode({**stored, "target": np.ones(3, dtype=np.uint8)})[1].tolist() == [1.0, 1.0, 1.0]
