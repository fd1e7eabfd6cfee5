"""The kinds of target (project.data.targets): what each encodes, stratifies, mixes, scores and records."""

from collections import Counter

import numpy as np
import pytest
import torch

from project.data.augment import mix_batch
from project.data.folds import check_class_counts, fold_split
from project.data.targets import Classes, Values, kind_named
from project.errors import UserError
from project.registry import load_all

NAMES = ("a", "b", "c")


def test_each_kind_encodes_its_labels_as_its_loss_takes_them():
    assert Classes(NAMES).encode([2, 0]).tolist() == [2, 0] and Classes(NAMES).encode([1]).dtype == torch.long
    values = Values(("age", "height")).encode([(30.5, 1.8), (4.0, 1.0)])
    assert values.dtype == torch.float32 and values.shape == (2, 2) and values[0, 0] == 30.5
    assert Values(("value",)).encode([(1.5,), (2.0,)]).shape == (2, 1)
    # prepare stores what streaming reads back as the same targets
    assert Classes(NAMES).stored(2) == 2
    assert Values(("v",)).stored((2.5,)).dtype == np.float32


def test_each_kind_says_its_metric_direction_outputs_and_recorded_name():
    assert [(k.metric, k.mode) for k in (Classes, Values)] == [("acc", "max"), ("mae", "min")]
    assert all(name == kind.kind for name, kind in load_all("target_kinds").items())  # registered as recorded
    assert load_all("target_kinds")["classes"] is Classes
    assert Values(("x", "y")).outputs == 2 and Classes(NAMES).outputs == 3
    assert kind_named("values", ["v"]) == Values(("v",))
    # What deployment reads: the decoder of project.export.decoding is chosen by `kind` (absent: one class).
    assert "kind" not in Classes(NAMES).output_spec()
    assert Values(("v",)).output_spec()["kind"] == "values"


def test_values_are_read_from_cells_and_text_is_refused():
    def read(cell: str) -> float:
        return Values.read_cells([cell], ["angle"], False, None, str)[0]

    assert read(" -12.5 ") == -12.5 and read("3") == 3.0
    for cell, why in (
        ("cat", "is not a number"),
        ("", "is empty"),
        ("nan", "is not a finite"),
        ("inf", "is not a finite"),
    ):
        with pytest.raises(ValueError, match=rf"the value .* in column 'angle' {why}"):
            read(cell)


def test_values_are_stratified_by_quantile_bins():
    rng = np.random.default_rng(0)
    values = [(float(v),) for v in rng.normal(0, 10, 100)]
    strata = Values(("v",)).strata(values)
    assert sorted(Counter(strata).values()) == [10] * 10  # ten bins of ten
    order = np.argsort([v[0] for v in values])
    assert [strata[i] for i in order] == sorted(strata)  # bins follow the values
    assert Values(("v",)).strata(values[:7]) == [0] * 7  # too few images for two bins of five
    # Each fold holds one image of each bin: the folds see the same spread of values.
    train, val = fold_split(values, 10, 3, seed=0, targets=Values(("v",)))
    assert sorted(strata[i] for i in val) == list(range(10)) and sorted(train + val) == list(range(100))


def test_fold_checks_count_what_the_kind_counts():
    with pytest.raises(UserError, match="class 'c' has 1 image"):
        check_class_counts([0, 0, 1, 1, 2], 2, Classes(NAMES))
    check_class_counts([(1.0,), (2.0,)], 2, Values(("v",)))  # values: no name to count
    with pytest.raises(UserError, match="2 image.*fewer than data.num_folds=3"):
        check_class_counts([(1.0,), (2.0,)], 3, Values(("v",)))


def test_mixup_mixes_what_the_kind_says():
    torch.manual_seed(0)
    values = torch.tensor([[0.0], [10.0], [20.0], [40.0]])
    _, mixed = mix_batch(torch.rand(4, 3, 4, 4), values, Values(("v",)), 0.4, 0.0)
    lam = float((mixed[0] - values[3]) / (values[0] - values[3]))
    assert torch.allclose(mixed, lam * values + (1 - lam) * values.flip(0), atol=1e-5)
    _, soft = mix_batch(torch.rand(2, 3, 4, 4), torch.tensor([0, 2]), Classes(NAMES), 0.4, 0.0, p=0.0)
    assert soft.tolist() == [[1, 0, 0], [0, 0, 1]]  # one-hot rows


def test_each_kind_scores_a_split():
    probs, labels = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1]]), torch.tensor([0, 2])
    assert Classes(NAMES).score(probs, labels) == 0.5
    assert Classes(NAMES).per_name(probs, labels) == {"a": 1.0, "b": None, "c": 0.0}
    predicted, true = torch.tensor([[1.0, 2.0], [3.0, 6.0]]), torch.tensor([[2.0, 2.0], [3.0, 2.0]])
    assert Values(("x", "y")).score(predicted, true) == pytest.approx(1.25)
    assert Values(("x", "y")).per_name(predicted, true) == {"x": 0.5, "y": 2.0}


def test_a_checkpoint_records_the_kind_and_names_it_was_trained_on():
    from project.run.data_identity import recorded_names

    assert recorded_names({"data_identity": {"kind": "classes", "names": ["x"]}}) == ("classes", ["x"])
    # Written before the data recorded its kind: the task's own record of its names.
    assert recorded_names({"task": {"task": "ImageClassifier", "names": ["x", "y"]}}) == (
        "classes",
        ["x", "y"],
    )
