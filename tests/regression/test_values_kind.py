"""The values kind (project/regression/kind.py): what it encodes, reads from a cell, stratifies, mixes, scores and
records."""

from collections import Counter

import numpy as np
import pytest
import torch

from project.data.augment import mix_batch
from project.data.splits import check_parts, stratified_parts
from project.data.targets import kind_named
from project.errors import UserError
from project.regression.kind import Values


def test_values_encode_float_rows_and_store_them_as_float32():
    values = Values(("age", "height")).encode([(30.5, 1.8), (4.0, 1.0)])
    assert values.dtype == torch.float32 and values.shape == (2, 2) and values[0, 0] == 30.5
    assert Values(("value",)).encode([(1.5,), (2.0,)]).shape == (2, 1)
    # prepare stores what streaming reads back as the same targets
    assert Values(("v",)).stored((2.5,)).dtype == np.float32


def test_values_say_their_metric_direction_outputs_and_recorded_name():
    assert (Values.metric, Values.mode) == ("mae", "min") and Values(("x", "y")).outputs == 2
    assert kind_named("values", ["v"]) == Values(("v",))
    # What deployment reads: the decoder of project.export.decoding is chosen by `kind` (absent: one class).
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
    folds = stratified_parts(values, 10, seed=0, targets=Values(("v",)))
    assert sorted(strata[i] for i in folds[3]) == list(range(10)) and sorted(sum(folds, [])) == list(
        range(100)
    )


def test_fold_checks_count_images_of_values():
    check_parts([(1.0,), (2.0,)], 2, Values(("v",)), "data.split.num_folds")  # values: no name to count
    with pytest.raises(UserError, match="2 image.*fewer than data.split.num_folds=3"):
        check_parts([(1.0,), (2.0,)], 3, Values(("v",)), "data.split.num_folds")


def test_mixup_mixes_the_values_themselves():
    torch.manual_seed(0)
    values = torch.tensor([[0.0], [10.0], [20.0], [40.0]])
    _, mixed = mix_batch(torch.rand(4, 3, 4, 4), values, Values(("v",)), 0.4, 0.0)
    lam = float((mixed[0] - values[3]) / (values[0] - values[3]))
    assert torch.allclose(mixed, lam * values + (1 - lam) * values.flip(0), atol=1e-5)


def test_values_score_a_split_by_mean_absolute_error():
    predicted, true = torch.tensor([[1.0, 2.0], [3.0, 6.0]]), torch.tensor([[2.0, 2.0], [3.0, 2.0]])
    assert Values(("x", "y")).score(predicted, true) == pytest.approx(1.25)
    assert Values(("x", "y")).per_name(predicted, true) == {"x": 0.5, "y": 2.0}
