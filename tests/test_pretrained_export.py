"""A fine-tuned pretrained backbone (TimmNet) exported: the export rebuilds the network from the checkpoint
alone, without loading (or downloading) its pretrained weights again. Needs the pretrained and production
parts both (parts.yaml lists this file in each)."""

import pytest
import torch

from project.cli import main
from project.export.trained import load_trained
from tests.conftest import CONFIGS
from tests.test_pretrained import TINY_TIMM, saved_timm_weights


@pytest.mark.slow
def test_export_rebuilds_a_fine_tuned_timm_network_without_its_weights_file(image_folder, tmp_path):
    weights = tmp_path / "weights.pth"
    saved_timm_weights(weights, TINY_TIMM)
    main([
        "fit", "--config", str(CONFIGS / "folder.yaml"), "--config", str(CONFIGS / "experiment" / "photos_finetune.yaml"),
        "--data.root", str(image_folder), "--data.skip_corrupt", "true", "--model.net.init_args.name", TINY_TIMM,
        "--model.net.init_args.weights_file", str(weights), "--data.image_size", "32", "--data.batch_size", "8",
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
        "--trainer.limit_val_batches", "1", "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--test_after_fit", "false",
        "--trainer.default_root_dir", str(tmp_path / "runs"),
    ])  # fmt: skip
    (ckpt,) = (tmp_path / "runs").glob("runs/version_*/checkpoints/last.ckpt")
    trained = torch.load(ckpt, weights_only=True)["state_dict"]
    weights.unlink()  # a rebuild that reached for the pretrained file would fail now
    rebuilt = load_trained(ckpt).net.state_dict()
    assert rebuilt.keys() == {k.removeprefix("net.") for k in trained if k.startswith("net.")}
    assert all(
        torch.equal(rebuilt[k.removeprefix("net.")], v) for k, v in trained.items() if k.startswith("net.")
    )
