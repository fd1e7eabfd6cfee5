"""Real values per image end to end, as a user runs them: `configs/csv_regression.yaml` on a CSV of values (fit,
validate, test, predict), the W&B dashboard of a 1-output head, export and predict_onnx and serve answering
values, cv and tune minimising val/mae; the one-line refusals of a task given data of another kind and of a
linked setting set by hand."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from project.cli import main
from project.csv.labels import ImageCSVDataModule
from project.errors import UserError
from project.regression.kind import Values
from tests.conftest import CONFIGS, run_cli
from tests.fakes import make_image_folder
from tests.wandb_reader import read_records, read_run


def values_csv(folder: Path, n: int = 64, name: str = "values.csv", seed: int = 0) -> Path:
    """`folder/<name>` over 8x8 PNGs in `folder/img`: each image's brightness is its value (in [-20, 20])."""
    rng = np.random.default_rng(seed)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        value = float(rng.uniform(-20, 20))
        pixels = np.clip(128 + 5 * value + rng.normal(0, 8, (8, 8, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / "img" / f"{seed}_{i}.png")
        rows.append(f"img/{seed}_{i}.png,{value:.3f}")
    (folder / name).write_text("\n".join(["path,angle", *rows]) + "\n")
    return folder / name


def fit_args(data: Path, root: Path, *extra: object) -> list[str]:
    """The shipped regression config on the tiny values, with a tiny MLP, short and on the CPU."""
    args = [
        "--config", CONFIGS / "csv_regression.yaml", "--data.csv", data / "values.csv",
        "--data.cache_dir", root / "cache", "--data.image_size", "8", "--data.batch_size", "8",
        "--data.num_workers", "0", "--data.val_fraction", "0.25",
        "--data.augment.flip", "false", "--data.augment.crop_padding", "0",
        "--model.net", "project.models.MLP", "--model.net.init_args.hidden", "16", "--model.scheduler", "null",
        "--model.optimizer.init_args.lr", "0.01", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
        "--trainer.default_root_dir", root / "logs", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", *extra,
    ]  # fmt: skip
    return [str(a) for a in args]


def truth(csv_file: Path) -> dict[str, float]:
    return {Path(r["path"]).name: float(r["angle"]) for r in csv.DictReader(csv_file.open())}


def fit_run(root: Path) -> Path:
    """The folder of the fixture's fit (later commands on its checkpoints make run folders of their own)."""
    (run,) = {ckpt.parent.parent for ckpt in (root / "logs").rglob("last.ckpt")}
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One fit of the shipped regression config, with its default loggers (CSV and offline W&B), a test CSV of
    held-out images, and the network's width set by hand to what the data gives (honoured)."""
    root = tmp_path_factory.mktemp("regression")
    values_csv(root / "data")
    values_csv(root / "data", n=24, name="test.csv", seed=1)
    extra = ["--data.test_csv", root / "data" / "test.csv", "--trainer.max_epochs", "12"]
    extra += ["--model.net.init_args.num_classes", "1"]
    run_cli("fit", *fit_args(root / "data", root, *extra), cwd=root, timeout=600)
    return root


@pytest.mark.slow
def test_a_regression_fits_monitors_val_mae_and_beats_predicting_the_mean(trained):
    run = fit_run(trained)
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    val_mae = [float(r["val/mae"]) for r in rows if r.get("val/mae")]
    assert len(val_mae) == 12 and all(r.get("val/rmse") for r in rows if r.get("val/mae"))
    (best,) = (run / "checkpoints").glob("epoch*-val_mae*.ckpt")  # the checkpoint monitors val/mae, the least
    assert float(re.search(r"val_mae([\d.]+)\.ckpt", best.name)[1]) == pytest.approx(min(val_mae), abs=1e-4)
    checkpoint = torch.load(best, weights_only=True)
    assert checkpoint["data_identity"]["kind"] == "values" and checkpoint["task"]["outputs"] == "standardized"
    mean, std = checkpoint["task"]["mean"][0], checkpoint["task"]["std"][0]
    train_values = list(truth(trained / "data" / "values.csv").values())
    assert abs(mean - np.mean(train_values)) < 5 and 5 < std < 20  # the training part's, not all of them

    tested = run_cli(
        "test", "--config", run / "config.yaml", "--ckpt_path", best, "--trainer.logger", "false", cwd=trained
    )
    test_mae = float(re.search(r"test/mae\s*│\s*([\d.]+)", tested.stdout)[1])
    assert re.search(r"test/rmse\s*│\s*[\d.]+", tested.stdout)
    held_out = np.array(list(truth(trained / "data" / "test.csv").values()))
    baseline = np.abs(held_out - np.mean(train_values)).mean()  # predicting the training mean
    assert test_mae < 0.5 * baseline, (test_mae, baseline)
    validated = run_cli(
        "validate",
        "--config",
        run / "config.yaml",
        "--ckpt_path",
        best,
        "--trainer.logger",
        "false",
        cwd=trained,
    )
    assert float(re.search(r"val/mae\s*│\s*([\d.]+)", validated.stdout)[1]) == pytest.approx(
        min(val_mae), abs=1e-4
    )


@pytest.mark.slow
def test_predict_export_predict_onnx_and_serve_answer_values(trained):
    run = fit_run(trained)
    ckpt = run / "checkpoints" / "last.ckpt"
    run_cli(
        "predict", "--config", run / "config.yaml", "--ckpt_path", ckpt, "--trainer.logger", "false",
        "--prediction_writer.output_path", trained / "predicted.csv", "--data.predict_csv",
        trained / "data" / "test.csv", cwd=trained,
    )  # fmt: skip
    predicted = list(csv.DictReader((trained / "predicted.csv").open()))
    assert list(predicted[0]) == ["input", "value"] and len(predicted) == 24
    by_ckpt = {Path(r["input"]).name: float(r["value"]) for r in predicted}
    errors = [abs(v - truth(trained / "data" / "test.csv")[name]) for name, v in by_ckpt.items()]
    assert np.mean(errors) < 6  # the values of unseen images, in the data's units (their spread is 40)

    # part: production
    from project.export.model_export import export
    from project.export.predict_onnx import predict_onnx
    from project.serve.api import ClassifierAPI

    export(str(ckpt), format="onnx", output_dir=str(trained / "export"))
    meta = json.loads((trained / "export" / "model.json").read_text())
    assert meta["task"]["kind"] == "values" and meta["task"]["outputs"] == "values"  # un-standardised inside
    predict_onnx(
        str(trained / "export" / "model.onnx"), str(trained / "data" / "img"), str(trained / "onnx.csv")
    )
    by_onnx = {
        Path(r["input"]).name: float(r["value"]) for r in csv.DictReader((trained / "onnx.csv").open())
    }
    assert by_ckpt and all(by_onnx[name] == pytest.approx(v, abs=1e-3) for name, v in by_ckpt.items())
    api = ClassifierAPI(ckpt_path=str(ckpt))
    api.setup("cpu")
    name = next(iter(by_ckpt))
    answer = api.encode_response(
        api.predict(api.decode_request((trained / "data" / "img" / name).read_bytes()))
    )
    assert answer["values"]["value"] == pytest.approx(by_ckpt[name], abs=1e-3)
    # /part: production


# part: dashboards
@pytest.mark.slow
def test_the_default_wandb_dashboard_of_a_one_output_head_plots_predicted_against_true(trained):
    (run_dir,) = (trained / "logs" / "wandb").glob("offline-run-*")
    run = read_run(run_dir, finished=True)
    keys = {key for row in run["history"] for key in row}
    assert "val/predicted_vs_true_table/path" in keys and not any("confusion" in k for k in keys)
    table = json.loads((run_dir / "files" / run["summary"]["val/predicted_vs_true_table/path"]).read_text())
    split = ImageCSVDataModule(
        str(trained / "data" / "values.csv"), kind="values", val_fraction=0.25
    )._split()
    assert table["columns"] == ["true", "predicted"] and len(table["data"]) == len(split[1])  # every image
    true = sorted(row[0] for row in table["data"])
    validation = sorted(truth(trained / "data" / "values.csv").values())
    assert all(min(abs(t - v) for v in validation) < 1e-3 for t in true)
    artifacts = [
        r.artifact for r in read_records(next(run_dir.glob("run-*.wandb"))) if r.HasField("artifact")
    ]
    worst = [a for a in artifacts if "worst_predictions" in a.name][-1]
    files = {entry.path: entry.local_path for entry in worst.manifest.contents}
    rows = json.loads(Path(files["val/worst_predictions.table.json"]).read_text())
    assert rows["columns"] == ["image", "true", "predicted", "abs_error"] and len(rows["data"]) == 16
    errors = [row[3] for row in rows["data"]]
    assert errors == sorted(errors, reverse=True)  # the furthest off first


# /part: dashboards


# part: studies
@pytest.mark.slow
def test_cv_and_tune_minimise_val_mae(tmp_path):
    values_csv(tmp_path / "data", n=40)
    # CSV only (no W&B run to start), in each fold's own folder: a logger left at `logs` follows the fold's.
    csv_logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "logs", "name": "runs"},
    }
    logger = tmp_path / "logger.yaml"
    logger.write_text(yaml.safe_dump({"trainer": {"logger": [csv_logger]}}))
    common = fit_args(tmp_path / "data", tmp_path, "--trainer.max_epochs", "3")
    run_cli("cv", *common, "--config", logger, "--folds", "2", "--wandb", "false", cwd=tmp_path, timeout=600)
    (results,) = (tmp_path / "logs" / "cv").glob("*/cv_results.json")
    payload = json.loads(results.read_text())
    assert set(payload["summary"]) >= {"val/mae", "val/loss"} and payload["folds"][0]["kind"] == "values"
    assert "Per-value validation mean absolute error" in (results.parent / "cv_results.md").read_text()
    for fold in payload["folds"]:  # each fold's best checkpoint: its least val/mae
        metrics = next((results.parent / f"fold_{fold['fold']}").rglob("metrics.csv"))
        logged = [float(r["val/mae"]) for r in csv.DictReader(metrics.open()) if r.get("val/mae")]
        assert (
            fold["monitored_best"] == pytest.approx(min(logged), abs=1e-4) and "val_mae" in fold["checkpoint"]
        )
        assert fold["val/mae"] == pytest.approx(min(logged), abs=1e-3)

    # The search file searches the shipped one-cycle schedule: the trials keep it.
    scheduled = [a for i, a in enumerate(common) if "--model.scheduler" not in common[max(0, i - 1) : i + 1]]
    search = CONFIGS / "search" / "csv_regression.yaml"
    tune = [*scheduled, "--trainer.logger", "false", "--search", str(search)]
    run_cli(
        "tune", *tune, "--n_trials", "2", "--pruner", "none", "--wandb", "false", cwd=tmp_path, timeout=600
    )
    study = json.loads((tmp_path / "logs" / "tune" / "csv_regression" / "trials.json").read_text())
    assert (study["metric"], study["direction"]) == ("val/mae_best", "minimize")
    values = {r["trial"]: r["val/mae_best"] for r in study["trials"]}
    assert len(values) == 2 and values[study["best_trial"]] == min(values.values())


# /part: studies


# -- one line for what does not fit ----------------------------------------------------------------------------
def error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *map(str, args)])
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 or not any("Traceback" in line for line in lines), lines
    return lines[-1]


def test_a_task_given_data_of_another_kind_is_one_line_naming_both(tmp_path, capsys):
    values_csv(tmp_path / "data", n=12)
    classes = tmp_path / "data" / "classes.csv"
    classes.write_text("path,label\n" + "".join(f"img/0_{i}.png,{'ab'[i % 2]}\n" for i in range(12)))
    regressor = ["--config", CONFIGS / "csv_regression.yaml", "--data.cache_dir", tmp_path / "c"]
    line = error_line([*regressor, "--data.csv", classes, "--data.kind", "classes"], capsys)
    assert line == (
        "error: the data (ImageCSVDataModule) gives one class per image but model ImageRegressor takes real values "
        "per image: train it with --model ImageClassifier (as configs/folder.yaml does)"
    )
    classifier = ["--config", CONFIGS / "csv.yaml", "--data.csv", tmp_path / "data" / "values.csv"]
    line = error_line([*classifier, "--data.kind", "values", "--data.cache_dir", tmp_path / "c"], capsys)
    assert line == (
        "error: the data (ImageCSVDataModule) gives real values per image but model ImageClassifier takes one "
        "class per image: train it with --model ImageRegressor (as configs/csv_regression.yaml does)"
    )
    values = tmp_path / "data" / "values.csv"
    # part: tags
    line = error_line([*regressor, "--data.csv", values, "--model", "MultiLabelClassifier"], capsys)
    assert line.startswith("error: the data (ImageCSVDataModule) gives real values per image but model ")
    # /part: tags
    line = error_line([*regressor, "--data.csv", classes], capsys)  # class names read as values
    assert line.startswith("error: ") and "row 2: the value 'a' in column 'label' is not a number" in line


def test_a_linked_setting_set_by_hand_is_honoured_when_it_agrees_and_refused_when_not(tmp_path, capsys):
    folder = make_image_folder(tmp_path / "images", extras=False)  # 3 classes
    args = ["--config", CONFIGS / "folder.yaml", "--data.root", folder, "--data.cache_dir", tmp_path / "c"]
    args += ["--model.net", "SimpleCNN", "--trainer.logger", "false"]
    line = error_line([*args, "--model.net.init_args.num_classes", "5"], capsys)
    assert line == (
        "error: model.net.num_classes=5 is set, but it comes from the data (ImageFolderDataModule: "
        "data.num_classes=3), which fit links into it: leave model.net.num_classes out and the data sets it"
    )
    written = tmp_path / "net.yaml"
    written.write_text(yaml.safe_dump({"model": {"init_args": {"num_classes": 2}}}))
    line = error_line([*args, "--config", written], capsys)
    assert line.startswith(
        "error: model.num_classes=2 is set, but it comes from the data (ImageFolderDataModule"
    )


def test_a_network_of_another_width_than_the_task_needs_is_one_line(tmp_path):
    import lightning as L

    from project.models import MLP
    from project.regression.task import ImageRegressor

    csv_file = values_csv(tmp_path / "data", n=16)
    data = ImageCSVDataModule(
        str(csv_file), kind="values", image_size=8, batch_size=4, num_workers=0, cache_dir=str(tmp_path / "c")
    )
    net = MLP(num_classes=3, input_shape=(3, 8, 8), hidden=4)
    task = ImageRegressor(net, class_names=data.class_names, input_shape=(3, 8, 8))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(
        UserError,
        match=r"the network \(MLP\) gives 3 output\(s\) per image and ImageRegressor needs 1, one per value \(value\)",
    ):
        trainer.fit(task, datamodule=data)


# -- reading values ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_values_csv_gives_float_targets_and_a_split_that_keeps_their_spread(tmp_path):
    csv_file = values_csv(tmp_path / "data", n=40)
    data = ImageCSVDataModule(
        str(csv_file), kind="values", image_size=8, val_fraction=0.25, cache_dir=str(tmp_path / "c")
    )
    assert data.targets == Values(("value",)) and data.class_names == ["value"] and data.num_classes == 1
    written = list(truth(csv_file).values())
    assert [label[0] for label in data.train_labels] == pytest.approx(written, abs=1e-6)
    train, val = data._split()
    ranks = np.argsort(np.argsort(written))
    assert len(val) == 8 and sorted(ranks[val] // 5) == list(range(8))  # one of each eighth of the values
    data.setup("fit")
    x, y = next(iter(data.val_dataloader()))
    assert y.dtype == torch.float32 and y.shape == (len(x), 1)
    assert data.train_targets.shape == (32, 1)  # what the task standardises by: the part that trains
    several = tmp_path / "data" / "several.csv"
    several.write_text("path,a,b\n" + "".join(f"img/0_{i}.png,{i},{-i / 2}\n" for i in range(40)))
    two = ImageCSVDataModule(
        str(several), kind="values", label_columns=["a", "b"], image_size=8, cache_dir=str(tmp_path / "c")
    )
    assert two.class_names == ["a", "b"] and two.train_labels[3] == (3.0, -1.5)


def test_class_labels_that_look_like_measurements_are_told(tmp_path, capsys):
    csv_file = values_csv(tmp_path / "data", n=30)
    assert (
        len(ImageCSVDataModule(str(csv_file), image_size=8, cache_dir=str(tmp_path / "c")).class_names) == 30
    )
    err = capsys.readouterr().err
    (said,) = [line for line in err.splitlines() if "are all numbers" in line]
    assert "labels of" in said and said.endswith(
        "if they are measurements, read them as values: data.kind values"
    )


# part: benchmarks
def test_the_rotation_benchmark_turns_photos_by_their_target_angle_without_borders(tmp_path):
    """benchmarks/rotation_regression.py: the target is the angle each crop is turned by, no border shows, and the
    same seed builds the same dataset."""
    from benchmarks.rotation_regression import build, rotated_crop

    photo = np.zeros((120, 160, 3), np.uint8)
    photo[:, :80] = 255  # a vertical edge down the middle
    (tmp_path / "photos" / "test").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(photo).save(tmp_path / "photos" / ("test" if i == 3 else "") / f"{i}.png")
    Image.fromarray(np.full((120, 160, 3), 200, np.uint8)).save(tmp_path / "grey.png")
    for angle in (-45.0, -10.0, 0.0, 30.0, 45.0):
        assert np.asarray(rotated_crop(tmp_path / "grey.png", angle, 32)).min() > 190  # no border comes in
        crop = np.asarray(rotated_crop(tmp_path / "photos" / "0.png", angle, 32)).astype(float)
        assert crop.shape == (32, 32, 3)
        # Anticlockwise for a positive angle: the edge's top end moves left, so less of the top row is white.
        top, bottom = crop[0].mean(), crop[-1].mean()
        assert (
            (top < bottom - 20) if angle > 0 else (top > bottom + 20) if angle < 0 else abs(top - bottom) < 5
        )
    first = build(tmp_path / "photos", tmp_path / "a", 32, 45.0, seed=3)
    assert first["train_images"] == 3 and first["test_images"] == 1
    rows = list(csv.DictReader((tmp_path / "a" / "train.csv").open()))
    assert all(-45 <= float(r["angle"]) <= 45 for r in rows) and len({r["angle"] for r in rows}) == 3
    build(tmp_path / "photos", tmp_path / "b", 32, 45.0, seed=3)
    assert (tmp_path / "a" / "train.csv").read_text() == (tmp_path / "b" / "train.csv").read_text()
    baseline = json.loads((tmp_path / "a" / "baseline.json").read_text())
    mean = np.mean([float(r["angle"]) for r in rows])
    test_angle = float(next(csv.DictReader((tmp_path / "a" / "test.csv").open()))["angle"])
    assert baseline["test_mae_predicting_the_mean"] == pytest.approx(abs(test_angle - mean))


# /part: benchmarks
