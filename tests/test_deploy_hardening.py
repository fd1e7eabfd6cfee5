"""Deployment under bad input and bad outputs: a decompression bomb given to predict_onnx or serve, an export
or predictions file aimed at a read-only folder, an export folder that holds an export already."""

import json

import pytest
import torch
from PIL import Image

from project.cli import main
from project.errors import UserError
from tests import test_hardening
from tests.fakes import bomb_png, make_image_folder
from tests.test_bad_input import fails

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported
read_only_dir = test_hardening.read_only_dir  # a fixture: a folder nothing can be written into


def test_predict_onnx_names_a_bomb_and_writes_nothing(exported, tmp_path):
    from project.export.predict_onnx import predict_onnx

    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (40, 40), "red").save(images / "a.png")
    (images / "b.png").write_bytes(bomb_png())
    with pytest.raises(
        UserError,
        match=r"unreadable image file\(s\): .*b\.png \(ImageTooLarge: the image declares 400,000,000",
    ):
        predict_onnx(str(exported), str(images), output=str(tmp_path / "out.csv"))
    assert not list(tmp_path.glob("*.csv")) and not list(tmp_path.glob(".*"))


def test_serving_answers_a_bomb_413_and_the_rest_of_its_batch_as_usual(exported):
    from project.serve.api import ClassifierAPI, Rejected

    api = ClassifierAPI(onnx_path=str(exported), max_batch_size=4)
    api.setup("cpu")
    good = Image.new("RGB", (50, 40), "green")
    buffer = __import__("io").BytesIO()
    good.save(buffer, "PNG")
    batch = [
        api.decode_request(b)
        for b in (buffer.getvalue(), bomb_png(), buffer.getvalue(), bomb_png(8_000, 6_000))
    ]
    assert [type(x) for x in batch] == [torch.Tensor, Rejected, torch.Tensor, Rejected]
    assert batch[1].status == 413 and "400,000,000 pixels" in batch[1].detail
    assert batch[3].status == 413 and "8000x6000" in batch[3].detail
    answers = [api.encode_response(o) for o in api.predict(api.batch(batch))]
    assert answers[0]["class_name"] == answers[2]["class_name"] and answers[1].status_code == 413


def test_export_refuses_a_folder_that_holds_an_export_and_replaces_it_whole(trained_run, tmp_path):
    from project.export.model_export import export

    out = tmp_path / "export"
    # An earlier export (TorchScript: `all` would compile an AOTInductor package too).
    export(str(trained_run.ckpt), format="torchscript", output_dir=str(out))
    with pytest.raises(
        UserError, match=r"already holds model\.torchscript\.pt, model\.json .*--overwrite true"
    ):
        export(str(trained_run.ckpt), format="onnx", output_dir=str(out))
    export(str(trained_run.ckpt), format="onnx", output_dir=str(out), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "model.json",
        "model.onnx",
    ]  # the old TorchScript went too
    assert list(json.loads((out / "model.json").read_text())["files"]) == ["onnx"]


def test_read_only_export_and_predictions_are_named_before_anything_runs(
    trained_run, exported, image_folder, read_only_dir
):
    from project.export.model_export import export
    from project.export.predict_onnx import predict_onnx

    with pytest.raises(
        UserError, match=rf"output_dir {read_only_dir}/out is not a writable folder \(Read-only"
    ):
        export(str(trained_run.ckpt), output_dir=str(read_only_dir / "out"))
    with pytest.raises(
        UserError, match=r"output .* is not a writable folder .*before any image is classified"
    ):
        predict_onnx(str(exported), str(image_folder), output=str(read_only_dir / "p.csv"))


def test_predict_onnx_names_its_own_flag_for_unreadable_images(exported, tmp_path, capsys):
    folder = make_image_folder(tmp_path / "bad", classes=1, per_class=2, extras=True)  # with a corrupt .jpg
    args = ["predict_onnx", "--model", exported, "--input", folder, "--output", tmp_path / "p.csv"]
    message = fails(args, capsys)
    assert "broken.jpg" in message and "add --skip_corrupt" in message and "data.skip_corrupt" not in message
    main([str(a) for a in [*args, "--skip_corrupt", "true"]])  # what the message says to do
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 1 + 2
