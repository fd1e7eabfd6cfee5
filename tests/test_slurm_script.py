"""configs/slurm/train.sbatch, run with a stand-in `srun` on this machine: it starts `python -m project fit` with
the arguments it is given, and Lightning reads the ranks and the world from SLURM's variables (a real cluster
runs it in tests/test_slurm.py)."""

import os
import shlex
import subprocess
from pathlib import Path

from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DDPStrategy

from project.cli import build
from tests.conftest import CONFIGS, PACKAGE, ROOT
from tests.test_distributed import readme_commands

SLURM_RANK_1_OF_2 = {  # what srun sets for the task on the second of 2 nodes, 1 task per node
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "4242",
    "SLURM_NODELIST": "gpu-[07-08]",
    "SLURM_CPUS_PER_TASK": "4",
}


def srun_command(script_args: list[str], tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Runs configs/slurm/train.sbatch with a stand-in `srun` that records the command it would start."""
    bin_dir, record = tmp_path / "bin", tmp_path / "srun_args"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {record}\n")
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, **SLURM_RANK_1_OF_2, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(CONFIGS / "slurm" / "train.sbatch"), *script_args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return record.read_text().split("\0")[:-1]


def test_slurm_script_starts_lightning_with_slurms_ranks(tmp_path, monkeypatch):
    cpu = ["--trainer.accelerator", "cpu", "--trainer.strategy.init_args.process_group_backend", "gloo"]
    command = srun_command(cpu, tmp_path, {"CONFIG": "configs/cifar100.yaml"})
    assert command[1:4] == ["-m", PACKAGE, "fit"]
    assert command[command.index("--config") + 1] == "configs/cifar100.yaml"
    # The process srun starts, as rank 1 of 2: Lightning must take ranks and world from SLURM.
    monkeypatch.chdir(ROOT)
    for key, value in SLURM_RANK_1_OF_2.items():
        monkeypatch.setenv(key, value)
    # Lightning's SLURM environment writes MASTER_ADDR (the first node, gpu-07) and MASTER_PORT into
    # os.environ: set here, they are undone after the test, and no later DDP test of this worker waits on gpu-07.
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "unset"))  # recorded: undone after the test
        monkeypatch.delenv(key)
    args = command[4:]
    i = args.index("--ckpt_path")
    del args[i : i + 2]  # a `fit` argument: this parse has no subcommand
    cli = build([*args, "--trainer.logger", "false"])
    trainer = cli.trainer
    assert isinstance(trainer.strategy.cluster_environment, SLURMEnvironment)
    assert (trainer.num_nodes, trainer.num_devices, trainer.world_size) == (2, 1, 2)
    assert (trainer.global_rank, trainer.node_rank, trainer.local_rank) == (1, 1, 0)
    assert trainer.strategy.cluster_environment.main_address == "gpu-07"
    assert isinstance(trainer.strategy, DDPStrategy) and cli.datamodule.name == "cifar100"


def test_readme_sbatch_commands_pass_their_arguments(tmp_path):
    # The training script's lines (cv's and tune's sbatch lines are checked in tests/test_tune.py).
    commands = [c for c in readme_commands("sbatch ") if "train.sbatch" in c]
    commands += [c for c in readme_commands("CONFIG=") if " sbatch " in c]
    assert len(commands) >= 3
    for command in commands:
        words = shlex.split(command)
        env = dict(w.split("=", 1) for w in words[: words.index("sbatch")])
        script = next(i for i, w in enumerate(words) if w.endswith("train.sbatch"))
        extra = words[script + 1 :]
        recorded = srun_command(extra, tmp_path, env)
        assert recorded[len(recorded) - len(extra) :] == extra  # passed on to `fit`, in order
        assert recorded[recorded.index("--config") + 1] == env.get("CONFIG", "configs/cifar10.yaml")
        strategy = recorded[recorded.index("--config", recorded.index("--config") + 1) + 1]
        assert strategy == env.get("STRATEGY", "configs/trainer/ddp.yaml") and (ROOT / strategy).is_file()
