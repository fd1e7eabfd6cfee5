"""The `values` kind (regression) decoded from a task record, as export, predict_onnx, serve
and quantize read it; figures computed here by hand."""

import numpy as np
import pytest
import torch
from torch import nn

from project.errors import UserError
from project.export.decoding import decoder_for, deployed
from project.regression.kind import ValuesDecoder

SPEC = {"task": "ImageRegressor", "kind": "values", "names": ["age", "angle"], "outputs": "values"}


def test_values_are_answered_written_and_described_as_they_are():
    decoder = decoder_for(SPEC, ["ignored"])  # the record's names win
    assert isinstance(decoder, ValuesDecoder) and decoder.names == ("age", "angle")
    outputs = np.array([[31.5, -0.25], [4.0, 1e-7]], dtype=np.float32)
    assert decoder.probabilities(outputs) is outputs
    assert decoder.answer(outputs[0], top_k=5) == {"values": {"age": 31.5, "angle": -0.25}}
    assert decoder.csv_header() == ["age", "angle"] and decoder.csv_row(outputs[1]) == ["4", "1e-07"]
    assert decoder.describe() == {"kind": "values", "names": ["age", "angle"]}
    assert decoder.output_name == "values"


def test_the_quality_figure_is_r2_averaged_over_the_targets_and_agreement_is_within_one_percent():
    decoder = decoder_for(SPEC, [])
    truth = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    predicted = truth + np.array([[0.5, 0.0], [-0.5, 0.0], [0.5, 0.0], [-0.5, 0.0]])
    # R² = 1 - SS_res / SS_tot per target: 1 - 1.0 / 5.0 for the first, 1 for the second; their mean 0.9.
    assert decoder.score(decoder.reduce(predicted), truth) == pytest.approx(0.9)
    reference = np.array([[100.0, 0.5], [100.0, 0.5]])
    close = np.array([[100.9, 0.509], [101.1, 0.5]])  # 0.9 of 100 within 1%; 0.009 within 0.01 (of 1)
    assert decoder.agreement(close, reference) == 0.5  # the second image's 1.1 is not


def test_standardized_outputs_are_turned_into_values_and_an_export_holds_the_values():
    spec = SPEC | {"outputs": "standardized", "mean": [30.0, 0.0], "std": [10.0, 2.0]}
    decoder = decoder_for(spec, [])
    raw = np.array([[1.0, -0.5]], dtype=np.float32)
    np.testing.assert_allclose(decoder.probabilities(raw), [[40.0, -1.0]])
    torch.testing.assert_close(decoder.probabilities(torch.from_numpy(raw)), torch.tensor([[40.0, -1.0]]))

    net = nn.Linear(3, 2)
    exported_net, task, exported_decoder = deployed(net, spec, [])
    assert task["outputs"] == "values" and "mean" not in task and "std" not in task
    x = torch.randn(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(
            exported_net(x), torch.tensor([30.0, 0.0]) + net(x) * torch.tensor([10.0, 2.0])
        )
    outputs = np.array([[7.0, 8.0]], dtype=np.float32)
    assert exported_decoder.probabilities(outputs) is outputs  # the export's outputs are the values


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SPEC | {"outputs": "logits"}, "values or standardized, not 'logits'"),
        (SPEC | {"outputs": "standardized", "mean": [1.0], "std": [1.0, 2.0]}, "1 means and 2 stds for 2"),
        ({"kind": "boxes"}, "of kind 'boxes', which this version cannot decode"),
    ],
)
def test_a_record_that_cannot_be_decoded_is_one_line(spec, message):
    with pytest.raises(UserError, match=message):
        decoder_for(spec, ["a", "b"])
