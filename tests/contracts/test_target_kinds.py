"""The target-kind seam's contract: every registered kind of target (`target_kinds`, project.registry), with the
example labels it gives (`TargetKind.example`), encodes them as its loss takes them and stores them as `prepare`
writes them (read back as the same targets), stratifies splits and folds, mixes two images' targets for
MixUp/CutMix, names a metric and its direction that rank a perfect answer above a wrong one, and records what its
outputs mean for deployment (read back by its `decoder`).

A new kind joins by registering; `python -m pytest tests/contracts` then checks it."""

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from project.data.augment import mix_batch
from project.data.splits import HoldOut, stratified_parts
from project.data.targets import TargetKind, kind_named
from project.registry import load_all

N = 20


@dataclass(frozen=True)
class Example:
    """A kind over its names, and the labels of N images as a source gives them (`LabelledFiles.labels`)."""

    kind: TargetKind
    labels: list[Any]

    @property
    def id(self) -> str:
        return self.kind.kind


#: Every registered kind of target, on the example it gives.
EXAMPLES = [Example(*kind.example()) for kind in load_all("target_kinds").values()]


@pytest.fixture(params=EXAMPLES, ids=lambda e: e.id)
def example(request) -> Example:
    return request.param


def test_every_kind_gives_an_example_of_n_labels():
    assert [type(e.kind) for e in EXAMPLES] == list(load_all("target_kinds").values())
    assert all(len(e.labels) == N for e in EXAMPLES)


def test_its_recorded_name_builds_it_again(example):
    kind = example.kind
    assert load_all("target_kinds")[kind.kind] is type(kind)
    assert kind_named(kind.kind, list(kind.names)) == kind  # what checkpoints and prepared datasets record
    assert kind.outputs == len(kind.names)  # one network output per name
    assert kind.noun and kind.described


def test_encodes_labels_one_row_per_image(example):
    kind, labels = example.kind, example.labels
    targets = kind.encode(labels)
    assert targets.dtype in (torch.int64, torch.float32) and len(targets) == N
    assert targets.shape[1:] == kind.encode([]).shape[1:]  # the empty batch has the same rows
    for i in (0, 7, N - 1):  # a label encodes alone as it does among others
        assert torch.equal(kind.encode([labels[i]])[0], targets[i])
    soft = kind.mixable(targets)
    assert soft.dtype == torch.float32 and soft.shape == (N, kind.outputs)


def stored_bytes(value: Any) -> Any:
    """A stored label through the serialisation litdata applies to a sample's fields (numpy arrays, ints)."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(value), allow_pickle=False)
    buffer.seek(0)
    back = np.load(buffer)
    return back if isinstance(value, np.ndarray) else back.item()


def test_stored_labels_read_back_as_the_encoded_targets(example):
    kind, labels = example.kind, example.labels
    targets = kind.encode(labels)
    for label, target in zip(labels, targets, strict=True):
        stored = stored_bytes(kind.stored(label))  # what `prepare` writes
        assert torch.equal(torch.as_tensor(np.asarray(stored)).to(target.dtype), target)
    # part: streaming
    pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")
    from PIL import Image

    from project.streaming.source import DecodeSample

    png = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(png, format="PNG")
    read = DecodeSample(4, names=kind.outputs, noun=kind.noun, split="train")  # what streaming reads it as
    for i, (label, target) in enumerate(zip(labels, targets, strict=True)):
        _, back = read({"image": png.getvalue(), "target": kind.stored(label), "index": i})
        assert torch.equal(torch.as_tensor(back).to(target.dtype), target)
    # /part: streaming


def test_stratifies_splits_and_folds(example):
    kind, labels = example.kind, example.labels
    strata = kind.strata(labels)  # None: tag sets, dealt by iterative stratification instead
    if strata is not None:
        assert len(strata) == N and all(isinstance(s, int) and s >= 0 for s in strata)
    counts = kind.counts(labels)  # None: names that do not group images (values)
    if counts is not None:
        assert len(counts) == kind.outputs and all(c >= 0 for c in counts) and sum(counts) > 0
    parts = stratified_parts(labels, 4, seed=0, targets=kind)  # k-fold's folds, prepare's stored parts
    assert all(parts) and sorted(i for part in parts for i in part) == list(
        range(N)
    )  # each image in one part
    train, val = HoldOut(0.25).split(labels, 0, kind)  # the default validation split
    assert val and sorted(train + val) == list(range(N))


def test_mixing_two_images_interpolates_their_targets(example):
    kind = example.kind
    targets = kind.encode(example.labels)
    own = kind.mixable(targets)
    torch.manual_seed(0)
    images = torch.rand(N, 3, 4, 4)
    _, unmixed = mix_batch(images, targets, kind, 0.4, 0.0, p=0.0)
    assert torch.equal(unmixed, own)
    for mixup, cutmix in ((0.4, 0.0), (0.0, 1.0)):
        _, soft = mix_batch(images, targets, kind, mixup, cutmix)
        assert soft.shape == own.shape and soft.dtype == torch.float32
        a, b = own, own.flip(0)  # each image mixed with the batch reversed
        lam = float(((soft - b) * (a - b)).sum() / (a - b).pow(2).sum())
        assert 0.0 <= lam <= 1.0
        torch.testing.assert_close(soft, lam * a + (1 - lam) * b)


def test_its_metric_ranks_a_perfect_answer_above_a_wrong_one(example):
    kind = example.kind
    targets = kind.encode(example.labels)
    assert kind.metric and kind.mode in ("min", "max")
    perfect = kind.mixable(targets)  # probabilities (or values) that are exactly the targets
    wrong = perfect.flip(0)  # each image answered with another's
    right, off = kind.score(perfect, targets), kind.score(wrong, targets)
    assert np.isfinite(right) and np.isfinite(off)
    assert (right > off) if kind.mode == "max" else (right < off), (right, off)
    per_name = kind.per_name(perfect, targets)
    assert list(per_name) == list(kind.names)


# part: production
def test_its_output_spec_is_decoded_for_deployment(example):
    from project.export.decoding import decoder_for, deployed

    kind = example.kind
    names = list(kind.names)
    spec = {"task": "AnyTask", "names": names} | kind.output_spec()  # as ImageTask.output_spec records it
    assert spec["outputs"] and spec["decode"]
    decoder = decoder_for(spec, names)
    assert list(decoder.names) == names
    outputs = torch.randn(N, kind.outputs, generator=torch.Generator().manual_seed(0))
    probs = decoder.probabilities(outputs)
    assert probs.shape == (N, kind.outputs)
    np.testing.assert_allclose(decoder.probabilities(outputs.numpy().astype(np.float64)), probs, rtol=1e-5)
    header, row = decoder.csv_header(), decoder.csv_row(probs[0].numpy())
    assert len(row) == len(header) and isinstance(decoder.answer(probs[0].numpy()), dict)
    reduced = decoder.reduce(outputs.numpy())
    assert np.isfinite(decoder.score(reduced, kind.encode(example.labels).numpy()))
    assert decoder.agreement(reduced, reduced) == 1.0
    net = torch.nn.Linear(3, kind.outputs)
    module, exported, after = deployed(net, spec, names)  # what `export` writes, and how its outputs are read
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(after.probabilities(module(x)), decoder.probabilities(net(x)))
    assert exported["names"] == names


# /part: production
