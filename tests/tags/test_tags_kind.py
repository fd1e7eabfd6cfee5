"""The tags kind (project/tags/kind.py): multi-hot targets, what it stores, counts, scores and records, how MixUp
mixes its rows, and that old checkpoints and prepared datasets keep their kind."""

import pytest
import torch

from project.data.augment import mix_batch
from project.data.splits import check_parts
from project.errors import UserError
from project.tags.kind import Tags

NAMES = ("a", "b", "c")


def test_tags_encode_multi_hot_rows_store_them_and_record_their_kind():
    tags = Tags(NAMES).encode([(0, 2), ()])
    assert tags.dtype == torch.float32 and tags.tolist() == [[1, 0, 1], [0, 0, 0]]
    assert Tags(NAMES).stored((1,)).tolist() == [0, 1, 0]  # what prepare writes, streaming reads back
    assert (Tags.metric, Tags.mode) == ("map", "max")
    assert Tags(NAMES).output_spec()["kind"] == "tags"  # what deployment reads the decoder by


def test_fold_checks_count_each_tags_images():
    with pytest.raises(UserError, match="tag 'b' has 1 image"):
        check_parts([(0, 1), (0, 2), (2,)], 2, Tags(NAMES), "data.split.num_folds")


def test_a_split_of_tags_is_scored_by_mean_average_precision():
    tags = torch.tensor([[1.0, 0, 1], [0, 1, 1]])
    assert Tags(NAMES).score(tags, tags) == pytest.approx(1.0)


def test_multi_hot_rows_are_mixed_the_same_way():
    y = torch.tensor([[1.0, 0, 1], [0, 1, 0], [0, 0, 1], [1, 1, 0]])
    torch.manual_seed(1)
    _, soft = mix_batch(torch.rand(4, 3, 8, 8), y, Tags(("a", "b", "c")), 0.4, 0.0)
    lam = float(soft[1, 1])  # image 1 (tag 1 only) is mixed with image 2 (tag 2 only)
    assert torch.allclose(soft, lam * y + (1 - lam) * y.flip(0))


def test_old_checkpoints_and_prepared_datasets_keep_their_kind(monkeypatch):
    from project.run.data_identity import recorded_names

    # A checkpoint written before the kind was recorded by its data: its task's names and kind.
    assert recorded_names({"task": {"task": "MultiLabelClassifier", "names": ["x", "y"]}}) == (
        "tags",
        ["x", "y"],
    )
    # part: streaming
    # A dataset prepared before the kind was recorded says `multilabel`.
    from project.streaming.source import StreamingImageDataModule

    meta = {"format": 1, "classes": ["x", "y"], "multilabel": True, "splits": {"train": 1, "val": 1}}
    meta |= {"mean": [0.5] * 3, "std": [0.2] * 3, "folds": None, "size": None, "source": "x"}
    data = StreamingImageDataModule.__new__(StreamingImageDataModule)
    monkeypatch.setattr(StreamingImageDataModule, "meta", property(lambda self: meta), raising=False)
    assert data.targets == Tags(("x", "y"))
    # /part: streaming
