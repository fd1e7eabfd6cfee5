"""The README's first command, `python -m project fit --config configs/sample.yaml`, trains offline on the images
shipped in samples/, tests its best checkpoint on their test split, and every fit ends with one line naming its
best checkpoint, its score, its test figure (where the data has a test split) and its metrics."""

import csv
import re
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import PACKAGE, ROOT, run_python

SAMPLE = ROOT / "samples" / "cifar10-3k"
FIRST_COMMAND = f"python -m {PACKAGE} fit --config configs/sample.yaml"
SUMMARY = re.compile(
    r"^best checkpoint: (?P<path>\S+\.ckpt) \((?P<monitor>\S+) (?P<score>[0-9.]+)\)"
    r"(; (?P<tested>test/\S+) (?P<test>[0-9.]+))?; metrics: (?P<metrics>\S+)$",
    re.M,
)


def workspace(folder: Path) -> Path:
    """A folder of one's own to run the first command in, as from a clone: the repository's configs and samples
    beside it, and its logs/ written there."""
    for name in ("configs", "samples"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def summary_of(stdout: str) -> re.Match:
    found = list(SUMMARY.finditer(stdout))
    assert len(found) == 1, stdout[-3000:]
    assert found[0].group(0) == stdout.strip().splitlines()[-1]  # the last line the fit prints
    return found[0]


def test_the_sample_holds_what_its_readme_says():
    classes = sorted(p.name for p in (SAMPLE / "train").iterdir())
    assert len(classes) == 10 and sorted(p.name for p in (SAMPLE / "test").iterdir()) == classes
    for split, per_class in (("train", 250), ("test", 50)):
        for name in classes:
            files = sorted((SAMPLE / split / name).iterdir())
            assert len(files) == per_class, (split, name)
            with Image.open(files[0]) as image:
                assert image.format == "JPEG" and image.size == (32, 32)
    # No image is in both splits (the test figure is on images the fit never saw).
    train = {(p.parent.name, p.name) for p in (SAMPLE / "train").glob("*/*")}
    assert not train & {(p.parent.name, p.name) for p in (SAMPLE / "test").glob("*/*")}
    terms = (SAMPLE.parent / "README.md").read_text()
    assert "CIFAR-10" in terms and "Krizhevsky" in terms
    assert sum(p.stat().st_size for p in SAMPLE.rglob("*.jpg")) < 5_000_000  # a few MB in every clone


@pytest.mark.slow
def test_a_fit_ends_with_its_best_checkpoint_its_score_its_test_figure_and_its_metrics(tmp_path):
    folder = workspace(tmp_path)
    flags = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3"]
    run = run_python("-m", PACKAGE, "fit", "--config", "configs/sample.yaml", *flags, cwd=folder)
    summary = summary_of(run.stdout)
    checkpoint = folder / summary["path"]
    assert checkpoint.is_file() and checkpoint.parent.name == "checkpoints"
    assert summary["monitor"] == "val/acc" and 0.0 <= float(summary["score"]) <= 1.0
    with open(folder / summary["metrics"]) as f:
        rows = list(csv.DictReader(f))
    scores = [float(row["val/acc"]) for row in rows if row.get("val/acc")]
    assert len(scores) == 2 and float(summary["score"]) == pytest.approx(max(scores), abs=5e-5)
    # The sample has a test split: the best checkpoint (not the last weights) was scored on it, once.
    (tested,) = [float(row["test/acc"]) for row in rows if row.get("test/acc")]
    assert summary["tested"] == "test/acc" and float(summary["test"]) == pytest.approx(tested, abs=5e-5)


def test_a_fit_told_not_to_tests_nothing(tmp_path):
    folder = workspace(tmp_path)
    flags = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "2", "--test_after_fit", "false"]
    run = run_python("-m", PACKAGE, "fit", "--config", "configs/sample.yaml", *flags, cwd=folder)
    summary = summary_of(run.stdout)
    assert summary["tested"] is None
    with open(folder / summary["metrics"]) as f:
        assert not [row for row in csv.DictReader(f) if row.get("test/acc")]


@pytest.mark.slow
def test_the_first_command_trains_offline_to_the_accuracy_the_readme_states(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert FIRST_COMMAND in readme
    stated = float(re.search(r"validation accuracy of about (0\.\d+)", readme).group(1))
    # As written, from a folder of its own; nothing in it reaches the network (W&B is offline by default).
    run = run_python(*FIRST_COMMAND.split()[1:], cwd=workspace(tmp_path), timeout=900)
    summary = summary_of(run.stdout)
    assert summary["monitor"] == "val/acc"
    # The figure holds within a few points on another CPU, whose kernels round differently.
    assert float(summary["score"]) >= stated - 0.04, (summary["score"], stated)
    stated_test = float(re.search(r"images of `test/` \(about (0\.\d+)[;)]", readme).group(1))
    assert float(summary["test"]) >= stated_test - 0.04, (summary["test"], stated_test)
