"""The CLI: every config parses and instantiates; links work; bad configs fail with one clear message."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from project import TOOLS
from project.cli import build, main, parse_fit_args, run_command
from project.data import CIFARDataModule, ImageFolderDataModule
from project.models import CIFARResNet, SimpleCNN
from tests.conftest import CONFIGS, PACKAGE, ROOT, run_cli

MAIN_CONFIGS = [
    "cifar10.yaml",
    "cifar100.yaml",
    "folder.yaml",
    # part: csv
    "csv.yaml",
    # part: tags
    "csv_multilabel.yaml",
    # /part: tags
    # part: regression
    "csv_regression.yaml",
    # /part: regression
    # /part: csv
]
# Everything in configs/ but the main configs, the search spaces of `tune` and the W&B sweeps stacks on a main one.
STACKABLE = sorted(
    str(p.relative_to(CONFIGS))
    for p in CONFIGS.rglob("*.yaml")
    if p.relative_to(CONFIGS).parts[0] not in ("search", "sweeps", "streaming.yaml", *MAIN_CONFIGS)
)


def needs_gpu(name: str) -> bool:
    """Presets that ask for GPUs (trainer/ddp.yaml, fsdp*.yaml) build a Trainer only where CUDA is; on CPUs,
    tests/test_distributed.py parses them and builds their strategies."""
    return (yaml.safe_load((CONFIGS / name).read_text()) or {}).get("trainer", {}).get("accelerator") == "gpu"


NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="the preset asks for GPUs")


def config_args(name: str, tmp_path: Path, image_folder: Path) -> list[str]:
    args = ["--config", str(CONFIGS / name), "--trainer.default_root_dir", str(tmp_path)]
    if name == "folder.yaml":
        args += ["--data.root", str(image_folder), "--data.cache_dir", str(tmp_path / "cache")]
    if name.startswith("csv"):
        csv = labels_csv(image_folder, values=name == "csv_regression.yaml")
        args += ["--data.csv", str(csv), "--data.cache_dir", str(tmp_path / "cache")]
    return args


def labels_csv(image_folder: Path, values: bool = False) -> Path:
    """`image_folder/labels.csv`: each image of the class folders (the corrupt one left out) and its folder's
    name (for the multi-label config, a set of one tag), or with `values` a real value per image."""
    images = sorted(image_folder.glob("*/img*"))
    labels = [f"{i / 4:.2f}" for i in range(len(images))] if values else [p.parent.name for p in images]
    rows = [f"{p.relative_to(image_folder)},{label}" for p, label in zip(images, labels, strict=True)]
    (image_folder / "labels.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    return image_folder / "labels.csv"


@pytest.mark.parametrize("name", MAIN_CONFIGS)
def test_main_configs_instantiate_with_linked_classes(name, tmp_path, image_folder):
    cli = build(config_args(name, tmp_path, image_folder))
    data, model = cli.datamodule, cli.model
    assert model.hparams.num_classes == data.num_classes == model.network_outputs
    assert model.class_names == data.class_names
    assert model.example_input_array.shape[1:] == data.input_shape
    # num_classes reached the injected network too: its output has one logit per class.
    assert model.net(model.example_input_array).shape == (2, data.num_classes)


class ClassesOnlyNet(nn.Module):
    """A user's network whose one setting comes from the data."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


@pytest.mark.parametrize(
    "net", [f"{__name__}.ClassesOnlyNet", "project.models.MLP"], ids=["classes-only", "MLP"]
)
def test_a_network_whose_settings_all_come_from_the_data_is_built_with_them(net, tmp_path, image_folder):
    """(MLP takes num_classes and input_shape, and with --model.net given alone, nothing else.)"""
    cli = build([*config_args("folder.yaml", tmp_path, image_folder), "--model.net", net])
    model = cli.model
    assert model.net(model.example_input_array).shape == (2, cli.datamodule.num_classes)


@pytest.mark.parametrize(
    "extra", [pytest.param(n, marks=[pytest.mark.gpu, NO_CUDA]) if needs_gpu(n) else n for n in STACKABLE]
)
def test_stackable_configs_apply_on_top(extra, tmp_path, image_folder):
    stacked = yaml.safe_load((CONFIGS / extra).read_text())
    folder_preset = extra.startswith(("experiment/folder", "experiment/photos"))
    base = "folder.yaml" if folder_preset else "cifar10.yaml"
    args = config_args(base, tmp_path, image_folder) + ["--config", str(CONFIGS / extra)]
    if "pretrained" in stacked.get("model", {}).get("net", {}).get("init_args", {}):
        # No download here: tests/test_pretrained.py loads the preset's weights from a local file.
        args += ["--model.net.init_args.pretrained", "false"]
    cli = build(args)
    for key, value in stacked.get("trainer", {}).items():
        if key == "logger" and value is False:
            assert not cli.trainer.loggers
        elif key == "logger":
            assert [type(lg).__name__ for lg in cli.trainer.loggers] == [
                lg["class_path"].rsplit(".", 1)[1] for lg in value
            ]
        elif key == "limit_train_batches":
            assert cli.trainer.limit_train_batches == value


@pytest.mark.parametrize("name", MAIN_CONFIGS)
def test_print_config_round_trips(name, tmp_path, image_folder, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_command(["fit", *config_args(name, tmp_path, image_folder), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["net"]["class_path"].startswith(f"{PACKAGE}.models.")
    assert printed["seed_everything"] == 42
    # What --print_config writes is itself a valid config, and describes the same run.
    saved = tmp_path / "printed.yaml"
    saved.write_text(yaml.safe_dump(printed))
    with pytest.raises(SystemExit):
        run_command(["fit", "--config", str(saved), "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out) == printed


def test_short_and_full_class_paths_are_the_same(tmp_path):
    for net, data in [
        ("SimpleCNN", "CIFARDataModule"),
        (f"{PACKAGE}.models.SimpleCNN", f"{PACKAGE}.data.CIFARDataModule"),
    ]:
        cli = build(["--model.net", net, "--data", data, "--data.name", "cifar100"])
        assert isinstance(cli.model.net, SimpleCNN) and isinstance(cli.datamodule, CIFARDataModule)
        assert cli.model.net.classifier[-1].out_features == 100


def test_command_line_overrides_and_later_configs_win(tmp_path, image_folder):
    args = config_args("cifar10.yaml", tmp_path, image_folder)
    cli = build([*args, "--model.net.init_args.depth", "34", "--data.init_args.batch_size", "64"])
    assert isinstance(cli.model.net, CIFARResNet) and len(cli.model.net.layer3) == 6
    assert cli.datamodule.batch_size == 64
    cli = build([*args, "--config", str(CONFIGS / "debug.yaml")])
    assert cli.trainer.max_epochs == 1 and not cli.trainer.loggers


def test_default_loggers_follow_default_root_dir(tmp_path):
    cli = build(
        ["--config", str(CONFIGS / "cifar10.yaml"), "--trainer.default_root_dir", str(tmp_path / "run")]
    )
    csv, wandb = cli.trainer.loggers
    assert Path(csv.save_dir) == tmp_path / "run" and Path(wandb.save_dir) == tmp_path / "run"
    assert wandb._offline


def test_logger_false_and_no_checkpointing_step_aside(tmp_path):
    base = ["--config", str(CONFIGS / "cifar10.yaml"), "--trainer.default_root_dir", str(tmp_path)]
    cli = build([*base, "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"])
    names = {type(c).__name__ for c in cli.trainer.callbacks}
    assert "LearningRateMonitor" not in names and "ModelCheckpoint" not in names
    assert "PredictionWriter" in names


def test_folder_config_needs_only_the_root(tmp_path, image_folder):
    cli = build(["--config", str(CONFIGS / "folder.yaml"), "--data.root", str(image_folder)])
    assert isinstance(cli.datamodule, ImageFolderDataModule) and cli.model.class_names == ["c0", "c1", "c2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.nott_a_key", "1"], "nott_a_key"),
        (["--trainer.max_epochs", "many"], "max_epochs"),
        (["--model.label_smoothing", "[1, 2]"], "label_smoothing"),
        (["--config", "configs/missing.yaml"], "missing.yaml"),
        (["--data.init_args.batch_size", "0"], "data.batch_size must be at least 1"),
    ],
    ids=["unknown-key", "wrong-type", "wrong-type-list", "missing-file", "out-of-range"],
)
def test_bad_config_exits_with_one_clear_message(args, message, tmp_path):
    proc = run_cli(
        "fit",
        "--config",
        CONFIGS / "cifar10.yaml",
        *args,
        "--trainer.default_root_dir",
        tmp_path,
        cwd=tmp_path.parent,
        check=False,
    )
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_top_level_help_is_answered_without_lightning_and_lists_every_command():
    """`python -m project --help` prints the command table without importing torch (seconds); its subcommands
    are LightningCLI's, with the Trainer methods' own summaries, and its tools are the ones main() runs."""
    import inspect

    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningCLI

    from project import SUBCOMMANDS

    code = f"import sys, runpy; sys.argv = ['{PACKAGE}', '--help']; runpy.run_module('{PACKAGE}', run_name='__main__');"
    code += "print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    ).stdout
    assert out.splitlines()[-1] == "False" and out.startswith(f"usage: python -m {PACKAGE}")
    assert list(SUBCOMMANDS) == list(LightningCLI.subcommands())
    for name, summary in SUBCOMMANDS.items():
        assert inspect.getdoc(getattr(Trainer, name)).startswith(summary.rstrip(".")), name
        assert f"  {name} " in out
    assert all(f"  {tool} " in out for tool in TOOLS)


def test_unknown_command_names_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fitt"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: unknown command 'fitt'; the commands are fit, validate, test, predict")
    assert line.split("the commands are ")[1].split(", ")[4:] == list(TOOLS)


def test_tools_parse_a_config_as_fit_does(tmp_path, image_folder):
    """cli.parse_fit_args (what the tools use) reads the shipped configs into the same model and data
    settings as `fit` itself."""
    for name in ("cifar10.yaml", "cifar100.yaml", "folder.yaml"):
        overrides = ["--data.root", str(image_folder)] if name == "folder.yaml" else []
        _, parsed = parse_fit_args(["--config", str(CONFIGS / name), *overrides])
        cli = build(["--config", str(CONFIGS / name), *overrides])
        assert parsed.model == cli.config.model and parsed.data == cli.config.data, name


def test_the_fast_exit_does_what_pythons_exit_does_but_the_teardown(tmp_path):
    """`python -m project` ends with `exit_without_teardown`: the exit code, flushed output, joined threads and
    the atexit handlers (logging, multiprocessing, W&B) all as after a normal exit."""
    script = f"""
import atexit, threading, time
from pathlib import Path
from {PACKAGE}.__main__ import exit_without_teardown
atexit.register(lambda: Path({str(tmp_path / "atexit")!r}).write_text("ran"))
threading.Thread(target=lambda: (time.sleep(0.3), Path({str(tmp_path / "thread")!r}).write_text("done"))).start()
print("unflushed", end="")
exit_without_teardown(3)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3 and done.stdout == "unflushed", done.stderr
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


def test_a_ctrl_c_during_the_fast_exit_ends_the_process_without_a_traceback(tmp_path):
    """A study's Ctrl-C can reach a fit just as it finishes: the command's work is done, so the exit ends at
    once with the command's code rather than as a KeyboardInterrupt inside an atexit handler."""
    script = f"""
import atexit, os, signal, time
from {PACKAGE}.__main__ import exit_without_teardown
atexit.register(lambda: time.sleep(30))
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))
print("done", end="")
exit_without_teardown(0)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "done" and done.stderr == "", done.stderr


def test_python_m_project_exits_with_the_commands_code(tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", PACKAGE, "fit", "--trainer.max_epochs", "many"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and 'error: Parser key "trainer.max_epochs"' in bad.stderr, bad.stderr


@pytest.mark.slow
def test_lightning_notices_with_nothing_to_act_on_are_left_out(image_folder, tmp_path):
    # A machine with SLURM installed but outside a job (a login node), no GPU or TPU, and a --ckpt_path run
    # without the fit-only callbacks: Lightning says something about each; a template user can act on none.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(ROOT)}
    args = ["--config", CONFIGS / "folder.yaml", "--data.root", image_folder, "--data.image_size", "16",
            "--data.cache_dir", tmp_path / "cache", "--data.skip_corrupt", "true", "--model.net", "SimpleCNN",
            "--trainer.logger", "false",
            "--trainer.default_root_dir", tmp_path / "logs", "--trainer.enable_progress_bar", "false"]  # fmt: skip
    outputs = []
    for command in (["fit", *args, "--trainer.max_steps", "2"], ["validate", *args, "--ckpt_path", "best"]):
        proc = subprocess.run(
            [sys.executable, "-m", PACKAGE, *map(str, command)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout + proc.stderr)
    for noise in ("srun", "TPU available", "GPU available: False", "callbacks used to create the checkpoint"):
        assert not [o for o in outputs if noise in o], (noise, outputs)
    assert "val/acc" in outputs[1]  # the run itself still reports


@pytest.mark.slow
def test_the_default_callbacks_are_the_listed_ones_each_under_its_key(tmp_path, image_folder, monkeypatch):
    """configs/callbacks/default.yaml lists every default callback: a flag sets its arguments, `null` leaves it out
    for one run, and an entry deleted from the list leaves it out of every run, which goes on without it."""
    from project.callbacks import BestAndLastCheckpoint
    from project.callbacks.diagnostics.grad_norm import GradientNormMonitor
    from project.cli import config

    args = config_args("folder.yaml", tmp_path, image_folder) + ["--trainer.logger", "false"]
    args += ["--data.skip_corrupt", "true", "--data.image_size", "16", "--model.net", "SimpleCNN"]
    listed = yaml.safe_load(config.DEFAULT_CALLBACKS.read_text())
    run = build([*args, "--checkpoint.monitor", "val/loss", "--checkpoint.mode", "min"])
    names = [type(c).__name__ for c in run.trainer.callbacks]
    assert {spec["class_path"].rsplit(".", 1)[1] for spec in listed.values()} - set(names) == {
        "BestAndLastCheckpoint",  # outside fit (build's pieces) no checkpoints
        "LearningRateMonitor",  # without a logger
    }
    fitted = run_command(["fit", *args, "--checkpoint.monitor", "val/loss", "--checkpoint.mode", "min",
                          "--grad_norm", "null", "--trainer.max_steps", "1"])  # fmt: skip
    (checkpoint,) = [c for c in fitted.trainer.callbacks if isinstance(c, BestAndLastCheckpoint)]
    assert (checkpoint.monitor, checkpoint.mode) == ("val/loss", "min")
    assert not [c for c in fitted.trainer.callbacks if isinstance(c, GradientNormMonitor)]

    trimmed = tmp_path / "default.yaml"
    trimmed.write_text(
        yaml.safe_dump({k: v for k, v in listed.items() if k not in ("grad_norm", "data_wait")})
    )
    monkeypatch.setattr(config, "DEFAULT_CALLBACKS", trimmed)
    config.default_callbacks.cache_clear()
    try:
        fitted = run_command(
            ["fit", *args, "--trainer.max_steps", "1", "--trainer.default_root_dir", tmp_path / "b"]
        )
        with pytest.raises(SystemExit):  # its flags are gone with it
            build([*args, "--grad_norm.per_layer", "false"])
    finally:
        config.default_callbacks.cache_clear()
    names = {type(c).__name__ for c in fitted.trainer.callbacks}
    assert (
        "GradientNormMonitor" not in names
        and "DataWaitMonitor" not in names
        and fitted.trainer.global_step == 1
    )


def test_the_core_names_no_optional_part():
    """The commands list their default callbacks in a config file: no part of the CLI or the run names the W&B
    dashboard, which a project made without it (configs/callbacks/default.yaml without its entry) lacks."""
    core = [*(ROOT / PACKAGE / "cli").glob("*.py"), *(ROOT / PACKAGE / "run").glob("*.py")]
    named = [p.name for p in core if re.search(r"wandb_dashboard|WandbDashboard", p.read_text())]
    assert named == []


def test_a_setting_given_with_a_checkpoint_file_is_the_one_used(tmp_path, fake_cifar):
    """`test --ckpt_path FILE --model.tta_flip true` evaluates with test-time flips: the command line's settings
    are the run's, never silently replaced by the hyperparameters the checkpoint recorded."""
    from tests.tiny_fit import tiny_args

    args = ["--config", str(CONFIGS / "cifar10.yaml"), *tiny_args(fake_cifar, tmp_path)]
    run_command(["fit", *args, "--trainer.max_steps", "1", "--test_after_fit", "false"])
    (checkpoint,) = (tmp_path / "runs").glob("version_*/checkpoints/last.ckpt")
    tested = run_command(["validate", *args, "--ckpt_path", str(checkpoint), "--model.tta_flip", "true"])
    assert tested.model.hparams.tta_flip is True
