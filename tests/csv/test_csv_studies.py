"""Cross-validation over a CSV of labels, as a user runs it (`cv` with configs/csv.yaml)."""

import pytest

from tests.conftest import CONFIGS, run_cli
from tests.csv.test_csv_data import dataset


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
