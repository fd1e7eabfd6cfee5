"""The data seam's contract: every example of SOURCES (a DataModule on tiny generated data), reads nothing when it
is built (the data -> model links read it on first use), says its class names, kind of target and input shape,
gives training batches that `transform_batch` makes normalised float images of the input shape with targets as its
kind encodes them, gives validation, test and prediction batches, and keeps in its `state_dict` what a checkpoint
needs to prepare images and read outputs as training did.

A new DataModule or source joins by registering (its package's REGISTER: project.registry) and giving its example:
the core's are in tests/contracts/tiny_data.py, a part's in its tests/<part>/contract_sources.py."""

import io
from pathlib import Path

import pytest
import torch

from project.data import ImageDataModule
from project.data.targets import Classes, TargetKind, kind_named
from project.errors import UserError
from project.registry import registered
from tests.contracts import tiny_data
from tests.contracts.tiny_data import LOADER, Source

# part: streaming
#: The folder of this test run that xdist's workers share (`_run_folder`): costly data is made there once.
RUN_FOLDER: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _run_folder(tmp_path_factory, request) -> None:
    base = tmp_path_factory.getbasetemp()  # a worker's own folder is inside the run's
    RUN_FOLDER[:] = [base.parent if hasattr(request.config, "workerinput") else base]


def prepared_chunks(root: Path) -> None:
    """A class folder converted into litdata chunks by `prepare`, as a user makes them, copied to `root`. Made
    once per test run: `prepare` starts worker processes, which takes seconds."""
    import fcntl
    import shutil

    from project.cli import main
    from tests.conftest import CONFIGS

    shared = RUN_FOLDER[0] / "contract-streaming"
    shared.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test worker prepares; the other waits for it
        if not (shared / "chunks" / "streaming.json").is_file():
            tiny_data.class_folder(shared / "images")
            main(["prepare", "--config", str(CONFIGS / "folder.yaml"), "--data.root", str(shared / "images"),
                  "--data.cache_dir", str(shared / "cache"), "--output_dir", str(shared / "chunks"), "--size", "16",
                  "--num_workers", "1"])  # fmt: skip
    shutil.copytree(shared / "chunks", root)


def streaming(root: Path) -> ImageDataModule:
    pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")
    from project.streaming.source import StreamingImageDataModule

    return StreamingImageDataModule(str(root), image_size=8, **LOADER)


# /part: streaming


#: Every example: the core's and those of the parts present.
SOURCES = [
    *tiny_data.sources(),
    # part: streaming
    Source("streaming", Classes, streaming, prepared_chunks),
    # /part: streaming
]


def test_every_registered_datamodule_and_source_has_an_example():
    exercised = {name for source in SOURCES for name in source.registered}
    missing = (set(registered("datamodules")) | set(registered("sources"))) - exercised
    assert not missing, f"give {sorted(missing)} an example (tests/<part>/contract_sources.py)"


@pytest.fixture(params=SOURCES, ids=lambda s: s.id)
def source(request) -> Source:
    return request.param


@pytest.fixture
def data(source, tmp_path) -> ImageDataModule:
    """The source built on its folder, then its tiny data written there."""
    root = tmp_path / "data"
    built = source.build(root)
    source.write(root)
    return built


def assert_targets_of_kind(y: torch.Tensor, kind: TargetKind, batch: int) -> None:
    """`y` is what `kind.encode` makes of `batch` labels: its dtype, its shape; and MixUp can mix it."""
    encoded = kind.encode([])
    assert y.dtype == encoded.dtype and y.shape == (batch, *encoded.shape[1:]), (y.dtype, y.shape)
    assert kind.mixable(y).shape == (batch, kind.outputs)  # (one-hot rows: a class index out of range raises)


def assert_normalised(x: torch.Tensor, data: ImageDataModule, batch: int) -> None:
    """Float images of the input shape, normalised by the source's own mean and std from [0, 1] pixels."""
    assert x.dtype == torch.float32 and x.shape == (batch, *data.input_shape), (x.dtype, x.shape)
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (data.mean, data.std))
    pixels = x * std + mean
    assert pixels.min() >= -1e-4 and pixels.max() <= 1 + 1e-4, (float(pixels.min()), float(pixels.max()))
    assert pixels.std() > 0  # an image, not a constant


def test_building_reads_and_writes_nothing_until_first_use(source, tmp_path):
    root = tmp_path / "data"
    built = source.build(root)  # nothing there yet: the data -> model links read it later, on first use
    assert list(tmp_path.iterdir()) == [], "building the DataModule wrote files"
    source.write(root)
    assert built.class_names and built.targets == source.kind(tuple(built.class_names))


def test_says_its_names_kind_and_input_shape(data, source):
    names = data.class_names
    assert isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    assert len(set(names)) == len(names)
    kind = data.targets
    assert type(kind) is source.kind and kind.names == tuple(names)
    assert data.num_classes == kind.outputs
    shape = data.input_shape
    assert len(shape) == 3 and shape[0] == 3 and all(isinstance(s, int) and s > 0 for s in shape), shape


def test_a_training_batch_becomes_normalised_images_and_targets_of_its_kind(data):
    data.setup("fit")
    x, y, *_ = batch = next(iter(data.train_dataloader()))
    size = LOADER["batch_size"]
    assert x.dtype == torch.uint8 and x.ndim == 4 and len(x) == size, (x.dtype, x.shape)
    assert_targets_of_kind(y, data.targets, size)
    images, targets, *own = data.transform_batch(tuple(batch), train=True)
    assert images.dtype == torch.float32 and images.shape == (size, *data.input_shape)
    assert images.isfinite().all()
    if own:  # a mixed batch (MixUp/CutMix): soft rows, then each image's own targets
        assert_targets_of_kind(own[0], data.targets, size)
    else:
        assert_targets_of_kind(targets, data.targets, size)
    evaluated, _ = data.transform_batch((x, y), train=False)
    assert_normalised(evaluated, data, size)


def test_gives_validation_test_and_prediction_batches(data):
    for stage in ("fit", "test", "predict"):
        data.setup(stage)
    for loader in (data.val_dataloader(), data.test_dataloader()):
        x, y = next(iter(loader))
        assert x.dtype == torch.uint8 and len(y) == len(x)
        assert_targets_of_kind(y, data.targets, len(x))
        assert_normalised(data.transform_batch((x, y), train=False)[0], data, len(x))
    x, index = next(iter(data.predict_dataloader()))  # each image with its place in the prediction set
    assert x.dtype == torch.uint8 and index.dtype == torch.int64 and index.shape == (len(x),)
    assert_normalised(data.transform_batch((x, index), train=False)[0], data, len(x))
    count = len(data.predict_set)  # pyright: ignore[reportArgumentType]
    assert len(data.predict_names) == count and all(0 <= int(i) < count for i in index)


def test_state_dict_holds_what_a_checkpoint_needs(data, source, tmp_path):
    data.setup("fit")  # (a source that measures its mean and std does it here)
    state = data.state_dict()
    assert state["class_names"] == data.class_names
    assert state["targets"] == data.targets.kind
    assert kind_named(state["targets"], state["class_names"]) == data.targets  # deployment rebuilds the kind
    assert state["mean"] == list(data.mean) and state["std"] == list(data.std)
    assert len(state["mean"]) == len(state["std"]) == data.input_shape[0] and all(s > 0 for s in state["std"])
    assert state["source_size"] >= data.input_shape[1]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state  # as a checkpoint stores it, and loads it safely
    fresh = source.build(tmp_path / "data")
    fresh.load_state_dict(state)  # evaluating from a checkpoint prepares images as training did
    assert tuple(fresh.mean) == tuple(data.mean) and tuple(fresh.std) == tuple(data.std)


def test_lists_the_samples_its_loaders_serve_or_says_in_one_line_that_it_cannot(data):
    """What a tool that stores the data elsewhere reads (`labelled_splits`): each split's items with the labels
    the loaders give them, or a UserError naming the method for a source that cannot list them."""
    try:
        listed = data.labelled_splits()
    except UserError as e:
        assert "does not list its samples: give it a labelled_splits() method" in str(e)
        return
    assert listed.classes == data.class_names and listed.targets == data.targets and listed.name
    assert listed.image_size >= data.input_shape[1] and listed.max_pixels > 0
    data.setup("fit")
    data.setup("test")
    served = {"train": data.train_set, "val": data.val_set}
    if data.has_test_split():
        served["test"] = data.test_set
    assert set(listed.splits) == set(served)
    for split, (items, labels) in listed.splits.items():
        dataset = served[split]
        assert dataset is not None and len(items) == len(labels) == len(dataset), split  # pyright: ignore[reportArgumentType]
        given = torch.stack([torch.as_tensor(dataset[i][1]) for i in range(len(labels))])  # pyright: ignore[reportArgumentType]
        encoded = data.targets.encode(labels)
        assert sorted(map(str, encoded.tolist())) == sorted(map(str, given.tolist())), split
