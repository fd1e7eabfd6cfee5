"""The extending page's "Add a network", "Add a dataset" and "Add a task" run as written: their code blocks are
read from the page, saved where the page says, and trained."""

import csv
import re
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import CONFIGS, PACKAGE, ROOT, newest_run, run_python
from tests.fakes import make_image_folder

PAGE = ROOT / "docs" / "extending.md" if (ROOT / "docs" / "extending.md").is_file() else ROOT / "README.md"


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def blocks(title: str, language: str) -> list[str]:
    """The fenced `language` code blocks of the page's section `title`, as written."""
    return re.findall(rf"```{language}\n(.*?)```", section(title), flags=re.S)


def launcher(module_file: Path, module: str) -> str:
    """`python -c` code that runs `python -m <package>` with `module_file` importable as `<package>.tasks.<module>`,
    as if saved there (the package's own folder stays untouched)."""
    return (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('{PACKAGE}.tasks.{module}', {str(module_file)!r})\n"
        "sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sys.modules[spec.name])\n"
        f"from {PACKAGE}.cli import main\n"
        "main(sys.argv[1:])\n"
    )


# part: csv
# part: regression
@pytest.mark.slow
def test_add_a_task_trains_and_predicts_as_written(tmp_path):
    from tests.regression.test_regression import values_csv

    (code,) = blocks("Add a task", "python")
    (config,) = blocks("Add a task", "yaml")
    module = re.search(r"saved as `project/tasks/(\w+)\.py`", section("Add a task"))[1]
    task_file = tmp_path / f"{module}.py"
    task_file.write_text(code.replace("from project.", f"from {PACKAGE}."))
    (tmp_path / f"{module}.yaml").write_text(config.replace("project.tasks.", f"{PACKAGE}.tasks."))
    stacked = re.search(r"\(`(--config configs/\S+ --config\s+\S+ --data.csv \S+)`\)", section("Add a task"))[
        1
    ]
    data = tmp_path / "data"
    values_csv(data, n=40)
    args = (
        stacked.replace("path/to/values.csv", str(data / "values.csv"))
        .replace("configs/", f"{CONFIGS}/")
        .split()
    )
    small = [
        "--data.cache_dir", tmp_path / "cache", "--data.image_size", "8", "--data.batch_size", "8",
        "--data.num_workers", "0", "--data.val_fraction", "0.25", "--model.net", "project.models.MLP",
        "--model.net.init_args.hidden", "16", "--model.scheduler", "null", "--trainer.max_epochs", "3",
        "--trainer.default_root_dir", tmp_path / "logs", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    run_python("-c", launcher(task_file, module), "fit", *args, *small, cwd=tmp_path)
    run = newest_run(tmp_path / "logs")
    (best,) = (run / "checkpoints").glob("epoch*-val_mae*.ckpt")  # the task's own metric picks the checkpoint
    assert torch.load(best, weights_only=True)["hyper_parameters"]["_class_path"].endswith(".SimpleRegressor")
    predict = ["predict", "--config", run / "config.yaml", "--ckpt_path", best, "--trainer.logger", "false"]
    predict += ["--prediction_writer.output_path", tmp_path / "predicted.csv"]
    run_python("-c", launcher(task_file, module), *predict, cwd=tmp_path)
    rows = list(csv.DictReader((tmp_path / "predicted.csv").open()))
    assert (
        list(rows[0]) == ["input", "value"] and len(rows) == 8
    )  # the validation images, each with its value
    assert all(abs(float(r["value"])) < 100 for r in rows)


# /part: regression
# /part: csv


@pytest.mark.slow
def test_add_a_network_trains_as_written(tmp_path):
    (config,) = blocks("Add a network", "yaml")
    name = re.search(r"class_path: (\w+)", config)[1]
    # The network the page asks for: a plain nn.Module whose __init__ takes num_classes (and here `width`).
    (tmp_path / "your_net.py").write_text(
        "from torch import nn\n\n\n"
        f"class {name}(nn.Module):\n"
        "    def __init__(self, num_classes: int = 10, width: int = 8):\n"
        "        super().__init__()\n"
        "        self.layers = nn.Sequential(\n"
        "            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, width), nn.ReLU(), nn.Linear(width, num_classes)\n"
        "        )\n\n"
        "    def forward(self, x):\n"
        "        return self.layers(x)\n"
    )
    (tmp_path / "net.yaml").write_text(config)
    images = make_image_folder(tmp_path / "images", extras=False)
    args = [
        "fit",
        "--config",
        CONFIGS / "folder.yaml",
        "--config",
        tmp_path / "net.yaml",
        "--data.root",
        images,
    ]
    args += ["--data.image_size", "16", "--data.cache_dir", tmp_path / "cache", "--trainer.max_steps", "2"]
    args += ["--trainer.default_root_dir", tmp_path / "logs", "--trainer.logger", "false"]
    launch = f"import sys, your_net; from {PACKAGE}.cli import main; main(sys.argv[1:])"
    run_python("-c", launch, *args, cwd=tmp_path)
    (last,) = (tmp_path / "logs").rglob("last.ckpt")
    weights = torch.load(last, weights_only=True)["state_dict"]
    assert weights["net.layers.4.weight"].shape == (3, 64)  # width 64 as configured, 3 classes from the data


@pytest.mark.slow
def test_add_a_dataset_trains_as_written(tmp_path):
    """The page's source, saved as the file it names, held by the DataModule of image files as its config says,
    and run by the command it gives: `fit` trains on the listing, and the checkpoint records its classes and
    the source that gave them."""
    (code,) = blocks("Add a dataset", "python")
    (config,) = blocks("Add a dataset", "yaml")
    module = re.search(r"in a file of its own \(`(\w+)\.py`", section("Add a dataset"))[1]
    (tmp_path / f"{module}.py").write_text(code.replace("from project.", f"from {PACKAGE}."))
    (tmp_path / f"{module}.yaml").write_text(config)
    listing = re.search(r"listing: (\S+)", config)[1]
    images = make_image_folder((tmp_path / listing).parent, classes=2, per_class=8, extras=False)
    rows = sorted(images.glob("*/*"))
    (tmp_path / listing).write_text("".join(f"{p.relative_to(images)},{p.parent.name}\n" for p in rows))
    command = re.search(
        r"`python -m project (fit --config \S+ --config \S+)` trains", section("Add a dataset")
    )[1]
    args = command.replace("configs/", f"{CONFIGS}/").split()
    small = [
        "--data.cache_dir", tmp_path / "cache", "--data.image_size", "8", "--data.batch_size", "4",
        "--data.num_workers", "0", "--data.val_fraction", "0.25", "--model.net", "project.models.MLP",
        "--model.net.init_args.hidden", "16", "--model.scheduler", "null", "--trainer.max_epochs", "2",
        "--trainer.default_root_dir", tmp_path / "logs", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    out = run_python("-m", PACKAGE, *args, *small, cwd=tmp_path).stdout
    # the listing's classes reached the task, which trained and kept its best checkpoint
    best = re.search(r"best checkpoint: (\S+) \(val/acc [\d.]+\)", out)
    assert best, out[-2000:]
    assert torch.load(best[1], weights_only=True)["data_identity"]["names"] == ["c0", "c1"]
    saved_config = yaml.safe_load((Path(best[1]).parents[1] / "config.yaml").read_text())
    assert saved_config["data"]["init_args"]["source"]["class_path"] == f"{module}.ImageList"


@pytest.mark.slow
def test_a_source_of_streams_fits_validates_and_tests_through_the_cli(tmp_path):
    """A user's source whose datasets are streams (`IterableDataset`s dealing their own samples, in
    tests/contracts/stream_source.py) needs no loaders of its own: `fit`, with two loader workers, trains on it,
    validates, and tests the best checkpoint."""
    config = tmp_path / "stream.yaml"
    config.write_text(
        "data:\n"
        "  class_path: tests.contracts.stream_source.ShadeStreamDataModule\n"
        "  init_args: {images: 32, batch_size: 8, num_workers: 2}\n"
        "model:\n"
        "  net: {class_path: SimpleCNN}\n"
        "trainer: {max_epochs: 2, logger: false, enable_progress_bar: false}\n"
    )
    args = ["fit", "--config", config, "--trainer.default_root_dir", tmp_path / "logs"]
    out = run_python("-m", PACKAGE, *args).stdout
    best = re.search(r"best checkpoint: (\S+) \(val/acc ([\d.]+)\); test/acc ([\d.]+)", out)
    assert best, out[-2000:]
    assert Path(best[1]).is_file()
    # dark and bright noise: told apart after two short epochs, or the stream never reached the network
    assert float(best[2]) > 0.7 and float(best[3]) > 0.7, best[0]
