"""The folds of a CSV of labels (every image validates once, statistics from the training part) and `cv` over a
CSV as a user runs it (configs/csv.yaml)."""

from collections import Counter

import pytest

from project.studies.folds import KFold
from tests.conftest import CONFIGS, run_cli
from tests.csv.test_csv_data import csv_dm, dataset


def test_folds_of_a_csv_cover_every_image_once_and_stats_come_from_training(tmp_path):
    csv = dataset(tmp_path, n=12)
    vals = []
    for fold in range(3):
        dm = csv_dm(csv, tmp_path, split=KFold(3, fold))
        dm.setup("fit")
        train, val = dm.train_set.indices.tolist(), dm.val_set.indices.tolist()
        assert sorted(train + val) == list(range(12)) and len(val) == 4
        assert set(Counter(dm.train_labels[i] for i in val).values()) <= {
            1,
            2,
        }  # 4 of each class over 3 folds
        assert dm.mean == pytest.approx(dm._cache("train").mean_std(dm.train_set.indices)[0])
        vals += val
    assert sorted(vals) == list(range(12))


@pytest.mark.slow
def test_cross_validation_over_a_csv(tmp_path):
    csv = dataset(tmp_path, n=18)
    args = [
        "cv", "--config", CONFIGS / "csv.yaml", "--data.csv", csv, "--data.cache_dir", tmp_path / "cache",
        "--model.net", "SimpleCNN", "--model.net.init_args.width", "4", "--model.net.init_args.hidden", "8",
        "--data.image_size", "8", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_epochs", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", tmp_path / "logs",
        "--folds", "2", "--wandb", "false",
    ]  # fmt: skip
    run_cli(*map(str, args), cwd=tmp_path)
    results = (tmp_path / "logs" / "cv" / "csv" / "cv_results.md").read_text()
    assert "| 0 |" in results and "| 1 |" in results and "| a |" in results
