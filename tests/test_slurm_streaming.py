"""Streaming under SLURM: the shipped configs/slurm/train.sbatch, unchanged, trains configs/streaming.yaml from
a prepared dataset on 2 tasks (DDP, gloo) of the one-node cluster of tests/slurm/start_cluster.sh (CI starts it;
the test skips without it)."""

import json
import subprocess

import pytest
import torch

from project.cli import main
from tests.conftest import CONFIGS, ROOT, subprocess_env
from tests.fakes import make_image_folder
from tests.test_slurm import slurm_unavailable, wait_for_job

pytest.importorskip("litdata", reason="streaming is an optional extra: pip install -e '.[streaming]'")


@pytest.mark.slow
def test_the_sbatch_script_trains_the_streaming_config_on_two_tasks(tmp_path):
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    # 4 validation images: at least processes x batch size (fewer is refused in one line).
    images = make_image_folder(tmp_path / "images", classes=2, per_class=20, extras=False)
    prepared = tmp_path / "prepared"
    main(["prepare", "--config", str(CONFIGS / "folder.yaml"), "--data.root", str(images), "--data.cache_dir",
          str(tmp_path / "cache"), "--output_dir", str(prepared), "--size", "16", "--num_workers", "1"])  # fmt: skip
    epochs, log = 2, tmp_path / "job.out"
    args = [
        "--data.input_dir", str(prepared), "--data.image_size", "8", "--data.batch_size", "2",
        "--data.num_workers", "0", "--model.net", "SimpleCNN", "--model.net.init_args.width", "4",
        "--model.scheduler", "null", "--trainer.max_epochs", str(epochs), "--trainer.logger", "false",
        "--trainer.default_root_dir", str(tmp_path / "logs"), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
    ]  # fmt: skip
    env = {**subprocess_env(), "CONFIG": "configs/streaming.yaml", "STRATEGY": "configs/trainer/ddp_cpu.yaml"}
    submit = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node", "0", "--nodes", "1", "--ntasks-per-node", "2",
         "--cpus-per-task", "1", "--time", "10", "--output", str(log), "--chdir", str(ROOT),
         str(CONFIGS / "slurm" / "train.sbatch"), *args],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    job_id = submit.stdout.strip().split(";")[0]
    try:
        state = wait_for_job(
            job_id, log, lambda s: s.get("JobState") in ("COMPLETED", "FAILED"), "its end", 400
        )
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    text = log.read_text()
    assert state["JobState"] == "COMPLETED", text
    assert "GLOBAL_RANK: 0" in text and "GLOBAL_RANK: 1" in text, text  # both tasks joined one DDP run
    assert "error:" not in text and "Traceback" not in text, text
    (last,) = (tmp_path / "logs").glob("runs/version_*/checkpoints/last.ckpt")
    step = torch.load(last, weights_only=True)["global_step"]
    train = json.loads((prepared / "streaming.json").read_text())["splits"]["train"]
    # Each rank streams its half of the training split: at least half of it in batches of 2, every epoch.
    assert step % epochs == 0 and step // epochs >= train // 2 // 2, (step, train, text)
