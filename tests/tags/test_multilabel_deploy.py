"""Multi-label models deployed: export writes each tag's threshold and sigmoid probabilities, predict_onnx and
serve answer tags, and the quantization report scores them by mAP and tag-set agreement."""

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from jsonargparse import Namespace
from PIL import Image
from torch import nn

from project.export.decoding import decoder_for
from project.export.model_export import export_trained
from project.export.preprocessing import Preprocessing
from project.export.report import accuracy, columns, markdown
from project.export.trained import TrainedModel
from project.models import MLP
from project.tags.kind import TagsDecoder
from tests.tags.test_multilabel import LOGITS, TAGS, TARGETS, identity_task


# -- downstream: export, predict_onnx, serve, quantize's report ---------------------------------------------
@pytest.fixture(scope="module")
def exported_tags(tmp_path_factory) -> tuple[Path, nn.Module]:
    """A tiny multi-label MLP on 8x8 images exported to ONNX and TorchScript, thresholds 0.4 and 0.6."""
    torch.manual_seed(0)
    net = MLP(num_classes=2, input_shape=(3, 8, 8), hidden=8).eval()
    task = identity_task().output_spec() | {"thresholds": [0.4, 0.6]}
    pre = Preprocessing((3, 8, 8), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), tuple(TAGS))
    out = tmp_path_factory.mktemp("tags_export")
    export_trained(TrainedModel(net, pre, Namespace(), Path("m.ckpt"), task), out)
    return out, net


def test_export_writes_tags_thresholds_and_sigmoid_probabilities(exported_tags):
    from project.export.runtimes import OnnxRuntime

    out, net = exported_tags
    meta = json.loads((out / "model.json").read_text())
    assert meta["task"]["names"] == TAGS and meta["task"]["thresholds"] == [0.4, 0.6]
    assert meta["task"]["outputs"] == "probabilities" and meta["task"]["kind"] == "tags"
    assert meta["output"]["meaning"].startswith("probabilities; every tag")
    assert meta["source"]["network"] == "MLP"
    assert meta["output"]["name"] == "probabilities"
    assert [o.name for o in OnnxRuntime(out / "model.onnx").session.get_outputs()] == ["probabilities"]
    x = torch.randn(5, 3, 8, 8)
    eager = torch.sigmoid(net(x))
    assert np.allclose(OnnxRuntime(out / "model.onnx")(x.numpy()), eager.detach().numpy(), atol=1e-5)
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    assert torch.allclose(scripted(x), eager, atol=1e-5)


def _png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (13, 9), colour).save(buffer, "PNG")
    return buffer.getvalue()


def test_predict_onnx_writes_tags(exported_tags, tmp_path):
    from project.export.predict_onnx import predict_onnx

    out, _ = exported_tags
    images = tmp_path / "images"
    images.mkdir()
    for i, colour in enumerate([(255, 0, 0), (0, 0, 255), (30, 200, 30)]):
        (images / f"{i}.png").write_bytes(_png(colour))
    predict_onnx(str(out / "model.onnx"), str(images), output=str(tmp_path / "p.csv"))
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert list(rows[0]) == ["input", "labels", "p_cat", "p_dog"] and len(rows) == 3
    for row in rows:  # each image's tags are those at or above their thresholds
        expected = [t for t, limit in zip(TAGS, (0.4, 0.6), strict=True) if float(row[f"p_{t}"]) >= limit]
        assert row["labels"].split() == expected


def test_serve_answers_labels_and_probabilities(exported_tags):
    from project.serve.api import ClassifierAPI

    out, net = exported_tags
    api = ClassifierAPI(onnx_path=str(out / "model.onnx"))
    api.setup("cpu")
    answer = api.encode_response(api.predict(api.decode_request(_png((255, 0, 0)))))
    assert set(answer) == {"labels", "probabilities"} and set(answer["probabilities"]) == set(TAGS)
    x = api.pre.normalize(api.pre.decode(_png((255, 0, 0)))[None])
    eager = torch.sigmoid(net(x))[0].tolist()
    assert [answer["probabilities"][t] for t in TAGS] == pytest.approx(eager, abs=1e-5)
    assert answer["labels"] == [t for t, p, limit in zip(TAGS, eager, (0.4, 0.6), strict=True) if p >= limit]


def test_quantize_report_gives_map_and_tag_set_agreement():
    decoder = decoder_for(identity_task().output_spec(), TAGS)  # logits in, as the eager network gives
    assert isinstance(decoder, TagsDecoder)
    batches = [(LOGITS[:2].numpy(), TARGETS[:2].numpy()), (LOGITS[2:].numpy(), TARGETS[2:].numpy())]
    flipped = {"FP32 eager": lambda x: x, "INT8": lambda x: x * np.array([1.0, -1.0], dtype=np.float32)}
    scores, samples = accuracy(flipped, batches, reference="FP32 eager", decoder=decoder)
    assert samples == 4 and scores["FP32 eager"] == {"accuracy": 1.0, "agreement": 1.0}
    # dog's ranking reversed: its positives come 3rd (after a tie of two negatives) and 4th
    assert scores["INT8"]["accuracy"] == pytest.approx((1.0 + (1 / 3 + 2 / 4) / 2) / 2)
    assert scores["INT8"]["agreement"] == 0.0  # at thresholds 0.5, every image's dog decision flips
    assert columns(decoder)[1] == "mAP" and columns(decoder)[-1] == "tag sets agree with FP32"
    from project.export.report import VariantResult

    result = VariantResult("fp32_eager", "FP32 eager", 1.0, 1.0, 1.0, 100.0, 1.0, "m.ckpt", "PyTorch eager")
    info = {
        "samples": 4,
        "split": "test",
        "threads": 1,
        "repeats": 1,
        "warmup": 1,
        "batch_size": 4,
        "calibration_batches": 1,
        "calibration": "minmax",
        "command": "the command that measured it",
        "machine": {"cpu": "cpu", "cpus": 1, "torch": "t", "onnxruntime": "o"},
        "qat": None,
    }
    text = markdown([result], info, decoder)
    assert text.startswith("| variant | mAP |") and "mAP (macro mean average precision over the tags" in text
