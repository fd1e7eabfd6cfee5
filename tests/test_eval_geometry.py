"""A model trained on crops of a larger decoded square (the photos recipe: `data.cache_size` above the input,
`data.augment.eval_crop` below 1) is deployed as it was evaluated: `export`'s JSON, `serve`'s decode, `predict_onnx`
and `quantize` cut the same central crop from the same decoded square that `test` did."""

import json
import re

import pytest
import torch

from project.cli import main
from project.data import ImageFolderDataModule
from project.data.augment import BatchAugmentation
from project.data.image_reading import decode_image, list_images
from project.export.model_export import export
from project.export.trained import load_trained
from tests.folder_fits import tiny_fit_args, tiny_folder

GEOMETRY = [
    "--data.cache_size",
    "24",
    "--data.augment.crop_scale",
    "[0.5, 1.0]",
    "--data.augment.eval_crop",
    "0.75",
]


@pytest.fixture(scope="module")
def cropped_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cropped")
    data = tiny_folder(root / "images", test=True)
    args = tiny_fit_args(data, root, "--trainer.max_epochs", "1", "--trainer.logger", "false", *GEOMETRY)
    main(["fit", *args])
    (ckpt,) = (root / "logs").rglob("last.ckpt")
    return root, data, args, ckpt


def test_the_checkpoint_says_how_evaluation_cut_its_images(cropped_run, tmp_path):
    root, data, _, ckpt = cropped_run
    pre = load_trained(ckpt).preprocessing
    assert (pre.input_shape, pre.source_size, pre.eval_crop) == ((3, 16, 16), 24, 0.75)

    export(str(ckpt), format="onnx", output_dir=str(tmp_path / "export"))
    meta = json.loads((tmp_path / "export" / "model.json").read_text())
    assert meta["preprocessing"]["source_size"] == 24 and meta["preprocessing"]["eval_crop"] == 0.75
    assert (
        "centre-crop to 24 x 24; keep the central 0.75 of each side; resize to 16 x 16"
        in meta["input"]["steps"]
    )

    # One photo, decoded as a server decodes an upload, is the network input `test` gave it.
    dm = ImageFolderDataModule(
        str(data),
        image_size=16,
        cache_size=24,
        augment=BatchAugmentation(eval_crop=0.75),
        cache_dir=str(root / "c"),
    )
    dm.mean, dm.std = pre.mean, pre.std
    file = list_images(data / "test")[0]
    square = torch.from_numpy(decode_image(file, 24)).permute(2, 0, 1)[None]
    evaluated, _ = dm.transform_batch((square, torch.zeros(1, dtype=torch.long)), train=False)
    served = pre.normalize(pre.decode(file)[None])
    assert served.shape == (1, 3, 16, 16)
    torch.testing.assert_close(served, evaluated)


# part: compression
@pytest.mark.slow
def test_quantize_measures_the_accuracy_test_measures(cropped_run, tmp_path, capsys):
    from project.export.quantize import quantize

    _, _, args, ckpt = cropped_run
    main(["test", *args, "--ckpt_path", str(ckpt)])
    tested = float(re.search(r"test/acc\s*[│|]\s*([0-9.]+)", capsys.readouterr().out).group(1))
    results = quantize(
        str(ckpt), output_dir=str(tmp_path / "q"),
        calibration_batches=1, repeats=1, warmup=0, threads=1, wandb=False,
    )  # fmt: skip
    fp32 = {r.variant: r for r in results}["FP32 eager"]
    assert fp32.accuracy == pytest.approx(tested, abs=1e-4)


# /part: compression
