"""The core's kind of target (project.data.targets): one class per image, what it encodes, stratifies, mixes,
scores and records, and kinds looked up by their recorded name."""

import pytest
import torch

from project.data.augment import mix_batch
from project.data.splits import check_parts
from project.data.targets import Classes, kind_named
from project.errors import UserError
from project.registry import load_all

NAMES = ("a", "b", "c")


def test_classes_encode_class_indices_and_store_them_as_they_are():
    assert Classes(NAMES).encode([2, 0]).tolist() == [2, 0] and Classes(NAMES).encode([1]).dtype == torch.long
    assert Classes(NAMES).stored(2) == 2  # prepare stores what streaming reads back as the same targets
    assert Classes(NAMES).counts([0, 2, 2]) == [1, 0, 2] and Classes(NAMES).strata([2, 0]) == [2, 0]


def test_a_kind_says_its_metric_direction_outputs_and_recorded_name():
    assert (Classes.metric, Classes.mode) == ("acc", "max") and Classes(NAMES).outputs == 3
    assert all(name == kind.kind for name, kind in load_all("target_kinds").items())  # registered as recorded
    assert load_all("target_kinds")["classes"] is Classes
    assert kind_named("classes", ["x", "y"]) == Classes(("x", "y"))
    with pytest.raises(ValueError, match="unknown kind of target 'boxes'; known: classes"):
        kind_named("boxes", ["x"])
    # What deployment reads: the decoder is chosen by `kind` (absent: one class).
    assert "kind" not in Classes(NAMES).output_spec()


def test_fold_checks_count_each_classs_images():
    with pytest.raises(UserError, match="class 'c' has 1 image"):
        check_parts([0, 0, 1, 1, 2], 2, Classes(NAMES), "data.split.num_folds")


def test_mixup_mixes_one_hot_rows_of_classes():
    _, soft = mix_batch(torch.rand(2, 3, 4, 4), torch.tensor([0, 2]), Classes(NAMES), 0.4, 0.0, p=0.0)
    assert soft.tolist() == [[1, 0, 0], [0, 0, 1]]  # one-hot rows


def test_classes_score_a_split_by_accuracy():
    probs, labels = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1]]), torch.tensor([0, 2])
    assert Classes(NAMES).score(probs, labels) == 0.5
    assert Classes(NAMES).per_name(probs, labels) == {"a": 1.0, "b": None, "c": 0.0}


def test_a_checkpoint_records_the_kind_and_names_it_was_trained_on():
    from project.run.data_identity import recorded_names

    assert recorded_names({"data_identity": {"kind": "classes", "names": ["x"]}}) == ("classes", ["x"])
    # Written before the data recorded its kind: the task's own record of its names.
    assert recorded_names({"task": {"task": "ImageClassifier", "names": ["x", "y"]}}) == (
        "classes",
        ["x", "y"],
    )
