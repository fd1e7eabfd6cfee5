"""`python -m project predict_onnx`: the same top-1 as `predict` from the checkpoint, on the same inputs, from an
ONNX model or an AOTInductor package."""

import csv
import json

import pytest

from project.errors import UserError
from project.export.predict_onnx import predict_onnx
from tests.conftest import CONFIGS, run_cli
from tests.fakes import make_image_folder

pytest_plugins = ["tests.deploy_fixtures"]  # fixtures: trained_run, exported, exported_aoti


def _rows(path) -> dict[str, dict]:
    with open(path) as f:
        return {row["input"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_cifar_split_matches_checkpoint_predict(trained_run, exported, tmp_path):
    run_cli(
        "predict", "--config", trained_run.config, "--ckpt_path", trained_run.ckpt,
        "--trainer.default_root_dir", tmp_path, "--prediction_writer.output_path", tmp_path / "ckpt.csv",
        cwd=tmp_path,
    )  # fmt: skip
    predict_onnx(
        str(exported), "cifar10:test", output=str(tmp_path / "onnx.csv"), data_dir=str(trained_run.data_dir)
    )
    ckpt, onnx = _rows(tmp_path / "ckpt.csv"), _rows(tmp_path / "onnx.csv")
    assert len(onnx) == 100 and set(ckpt) == set(onnx)  # every input predicted, named the same way
    assert [onnx[k]["class_index"] for k in ckpt] == [ckpt[k]["class_index"] for k in ckpt]
    assert [onnx[k]["class_name"] for k in ckpt] == [ckpt[k]["class_name"] for k in ckpt]
    assert max(abs(float(onnx[k]["probability"]) - float(ckpt[k]["probability"])) for k in ckpt) < 1e-4


@pytest.mark.slow
def test_image_folder_of_any_size_matches_checkpoint_predict(trained_run, exported, tmp_path):
    # 10 class folders (so the 10-class checkpoint fits), images of mixed sizes and modes, JPEG and PNG.
    folder = make_image_folder(tmp_path / "images", classes=10, per_class=2, extras=False)
    meta = json.loads(exported.with_name("model.json").read_text())["preprocessing"]
    # ... named as the checkpoint's classes: a checkpoint is refused on data whose classes differ.
    for index, name in enumerate(meta["class_names"]):
        (folder / f"c{index}").rename(folder / name)
    run_cli(
        "predict", "--config", CONFIGS / "folder.yaml", "--config", CONFIGS / "debug.yaml",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "8", "--model.net.init_args.hidden", "32",
        "--data.root", folder, "--data.predict_root", folder, "--data.image_size", "32",
        "--data.mean", json.dumps(meta["mean"]), "--data.std", json.dumps(meta["std"]),  # the checkpoint's
        "--data.cache_dir", tmp_path / "cache", "--ckpt_path", trained_run.ckpt,
        "--prediction_writer.output_path", tmp_path / "ckpt.csv", "--trainer.default_root_dir", tmp_path,
        cwd=tmp_path,
    )  # fmt: skip
    run_cli(
        "predict_onnx", "--model", exported, "--input", folder, "--output", tmp_path / "onnx.csv", "--batch_size", "7",
        cwd=tmp_path,
    )  # fmt: skip
    ckpt, onnx = _rows(tmp_path / "ckpt.csv"), _rows(tmp_path / "onnx.csv")
    assert len(onnx) == 20 and set(ckpt) == set(onnx)
    assert [onnx[k]["class_index"] for k in ckpt] == [ckpt[k]["class_index"] for k in ckpt]


@pytest.mark.slow
def test_an_aoti_package_predicts_what_the_onnx_model_does(exported, exported_aoti, tmp_path):
    folder = make_image_folder(tmp_path / "images", classes=3, per_class=4, extras=False)  # sizes and modes
    predict_onnx(str(exported), str(folder), output=str(tmp_path / "onnx.csv"), batch_size=5)
    predict_onnx(str(exported_aoti), str(folder), output=str(tmp_path / "aoti.csv"), batch_size=5)
    onnx, aoti = _rows(tmp_path / "onnx.csv"), _rows(tmp_path / "aoti.csv")
    assert len(aoti) == 12 and set(aoti) == set(onnx)
    assert [aoti[k]["class_name"] for k in onnx] == [onnx[k]["class_name"] for k in onnx]
    assert max(abs(float(aoti[k]["probability"]) - float(onnx[k]["probability"])) for k in onnx) < 1e-5


def test_bad_inputs_write_nothing(exported, tmp_path):
    out = tmp_path / "p.csv"
    with pytest.raises(UserError, match="neither a folder nor one of cifar10:test"):
        predict_onnx(str(exported), str(tmp_path / "missing"), output=str(out))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="contains no images"):
        predict_onnx(str(exported), str(tmp_path / "empty"), output=str(out))
    folder = make_image_folder(tmp_path / "bad", classes=1, per_class=2, extras=True)  # with a corrupt .jpg
    with pytest.raises(UserError, match="broken.jpg"):
        predict_onnx(str(exported), str(folder), output=str(out))
    with pytest.raises(UserError, match="model file .* does not exist"):
        predict_onnx(str(tmp_path / "none.onnx"), str(folder), output=str(out))
    (tmp_path / "other").mkdir()
    for name in ("model.pt2", "model.bin"):  # a .pt2 holding no compiled model; a file of no known kind
        (tmp_path / "other" / name).write_bytes(b"PK\x05\x06" + b"\0" * 18)
    (tmp_path / "other" / "model.json").write_bytes(exported.with_name("model.json").read_bytes())
    good = make_image_folder(tmp_path / "good", classes=1, per_class=2, extras=False)
    with pytest.raises(UserError, match=r"model\.pt2 is not an AOTInductor package"):
        predict_onnx(str(tmp_path / "other" / "model.pt2"), str(good), output=str(out))
    with pytest.raises(UserError, match=r"expected a \.onnx file or an AOTInductor \.pt2 package"):
        predict_onnx(str(tmp_path / "other" / "model.bin"), str(good), output=str(out))
    assert not out.exists() and not list(tmp_path.glob(".p.csv*"))


def test_every_unreadable_image_is_named_or_all_are_left_out(exported, tmp_path, capsys):
    folder = make_image_folder(tmp_path / "mixed", classes=1, per_class=3, extras=False)
    (folder / "c0" / "empty.png").write_bytes(b"")
    (folder / "c0" / "half.png").write_bytes((folder / "c0" / "img2.png").read_bytes()[:50])
    out = tmp_path / "p.csv"
    with pytest.raises(UserError, match=r"unreadable image file\(s\): .*empty\.png.*half\.png"):
        predict_onnx(str(exported), str(folder), output=str(out))
    assert not out.exists()
    predict_onnx(str(exported), str(folder), output=str(out), skip_corrupt=True)
    assert len(out.read_text().splitlines()) == 1 + 3  # the header and the three readable images
    assert "leaving out 2 unreadable image(s)" in capsys.readouterr().err
