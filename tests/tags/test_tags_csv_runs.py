"""A CSV of tags trained as a user trains it (configs/csv_multilabel.yaml): fit, predict, export and predict_onnx
agree; the per-tag figures and thresholds of two processes are those of one."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image


def colour_tagged(folder: Path, n: int = 48) -> Path:
    """`folder/tags.csv` over 8x8 PNGs: red when tagged `red`, blue when tagged `blue` (any of 4 sets)."""
    rng = np.random.default_rng(0)
    (folder / "img").mkdir(parents=True)
    rows = []
    for i in range(n):
        red, blue = i % 2 == 1, i % 4 >= 2
        pixels = rng.integers(0, 60, (8, 8, 3))
        pixels[..., 0] += 180 * red
        pixels[..., 2] += 180 * blue
        Image.fromarray(pixels.astype(np.uint8)).save(folder / "img" / f"{i}.png")
        rows.append(f"img/{i}.png,{' '.join(t for t, has in (('red', red), ('blue', blue)) if has)}")
    (folder / "tags.csv").write_text("\n".join(["path,tags", *rows]) + "\n")
    return folder / "tags.csv"


@pytest.mark.slow
def test_tagged_csv_fit_predict_export_and_predict_onnx_agree(tmp_path):
    from tests.conftest import CONFIGS, newest_run, run_cli

    csv_file = colour_tagged(tmp_path / "data")
    common = [
        "--config", CONFIGS / "csv_multilabel.yaml", "--config", CONFIGS / "debug.yaml",
        "--data.csv", csv_file, "--data.cache_dir", tmp_path / "cache", "--data.image_size", "8",
        "--data.batch_size", "8", "--data.num_workers", "0", "--data.val_fraction", "0.25",
        "--model.net", "project.models.MLP", "--model.net.init_args.hidden", "16",
        "--model.scheduler", "null", "--model.optimizer.init_args.lr", "0.01",
        "--trainer.default_root_dir", tmp_path / "logs", "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    refused = run_cli("fit", *common, "--model", "ImageClassifier", cwd=tmp_path, check=False)
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith("error: the data (ImageCSVDataModule) gives a set of tags per image")
    )
    run_cli(
        "fit", *common, "--model.pos_weight", "balanced", "--trainer.max_epochs", "8",
        "--trainer.limit_train_batches", "null", "--trainer.limit_val_batches", "null", cwd=tmp_path,
    )  # fmt: skip
    run = newest_run(tmp_path / "logs")
    ckpt = run / "checkpoints" / "last.ckpt"
    record = torch.load(ckpt, weights_only=True)["task"]
    assert record["kind"] == "tags" and record["names"] == ["blue", "red"] and len(record["thresholds"]) == 2

    predict = [
        "predict", "--config", run / "config.yaml", "--ckpt_path", ckpt,
        "--trainer.default_root_dir", tmp_path / "p", "--trainer.limit_predict_batches", "null",
        "--prediction_writer.output_path", tmp_path / "ckpt.csv",
    ]  # fmt: skip
    run_cli(*map(str, predict), cwd=tmp_path)
    by_ckpt = {Path(r["input"]).name: r for r in csv.DictReader((tmp_path / "ckpt.csv").open())}
    assert list(next(iter(by_ckpt.values()))) == ["input", "labels", "p_blue", "p_red"] and by_ckpt
    # The colours are learnable: the tags are right on (nearly) every predicted image.
    truth = {
        f"{i}.png": " ".join(t for t, has in (("blue", i % 4 >= 2), ("red", i % 2 == 1)) if has)
        for i in range(48)
    }
    right = sum(row["labels"] == truth[name] for name, row in by_ckpt.items())
    assert right >= 0.8 * len(by_ckpt)

    # part: production
    # export and predict_onnx give what predict gave; serve from the checkpoint answers the same tags
    from project.export.model_export import export
    from project.export.predict_onnx import predict_onnx

    export(str(ckpt), format="onnx", output_dir=str(tmp_path / "export"))
    predict_onnx(
        str(tmp_path / "export" / "model.onnx"), str(tmp_path / "data" / "img"), str(tmp_path / "o.csv")
    )
    by_onnx = {Path(r["input"]).name: r for r in csv.DictReader((tmp_path / "o.csv").open())}
    assert set(by_ckpt) <= set(by_onnx)
    for name, row in by_ckpt.items():
        assert by_onnx[name]["labels"] == row["labels"]
        assert float(by_onnx[name]["p_red"]) == pytest.approx(float(row["p_red"]), abs=1e-4)
    from project.serve.api import ClassifierAPI

    api = ClassifierAPI(ckpt_path=str(ckpt))
    api.setup("cpu")
    name, row = next(iter(by_ckpt.items()))
    answer = api.encode_response(
        api.predict(api.decode_request((tmp_path / "data" / "img" / name).read_bytes()))
    )
    assert " ".join(answer["labels"]) == row["labels"]
    assert answer["probabilities"]["red"] == pytest.approx(float(row["p_red"]), abs=1e-4)
    # /part: production


@pytest.mark.slow
def test_per_tag_figures_and_thresholds_on_two_processes_are_the_one_process_ones(tmp_path, monkeypatch):
    """val/f1 is measured at the thresholds each validation chooses from its precision-recall counts: the
    same on 2 gloo processes as on 1 only if those counts are summed over the processes."""
    import socket

    from tests.conftest import CONFIGS, run_cli
    from tests.tiny_runs import csv_logger_config

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    csv_file = colour_tagged(tmp_path / "data", n=40)
    common = [
        "--config", CONFIGS / "csv_multilabel.yaml", "--data.csv", csv_file, "--data.cache_dir", tmp_path / "c",
        "--data.image_size", "8", "--data.batch_size", "5", "--data.num_workers", "0", "--data.val_fraction", "0.5",
        "--model.net", "project.models.MLP", "--model.net.init_args.hidden", "8", "--model.scheduler", "null",
        "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    fit = ["--trainer.max_epochs", "1", "--trainer.logger", "false", "--trainer.accelerator", "cpu"]
    run_cli(*map(str, ["fit", *common, *fit, "--trainer.default_root_dir", tmp_path / "fit"]), cwd=tmp_path)
    (ckpt,) = (tmp_path / "fit").glob("**/checkpoints/last.ckpt")
    rows = []
    for name, extra in (("one", ["--trainer.accelerator", "cpu", "--trainer.devices", "1"]),
                        ("two", ["--config", CONFIGS / "trainer" / "ddp_cpu.yaml"])):  # fmt: skip
        logger = csv_logger_config(tmp_path / f"{name}.yaml", tmp_path / name)
        command = ["validate", *common, *extra, "--config", logger, "--ckpt_path", ckpt]
        run_cli(*map(str, [*command, "--trainer.default_root_dir", tmp_path / name]), cwd=tmp_path)
        (metrics,) = (tmp_path / name).glob("runs/version_*/metrics.csv")
        (row,) = [r for r in csv.DictReader(metrics.open()) if r.get("val/map")]
        rows.append({k: v for k, v in row.items() if k.startswith("val/") and k != "val/loss"})
    one, two = rows
    assert set(one) == {"val/map", "val/map_best", "val/f1", "val/ap/blue", "val/ap/red"} and one == two
    assert float(one["val/f1"]) < 1  # not a trivially perfect split: the thresholds matter
