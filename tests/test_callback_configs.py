"""Every configs/callbacks/*.yaml stacks onto a recipe (alone and all together) and resolves."""

import pytest
import yaml

from project.cli import run_command
from tests.conftest import CONFIGS, ROOT

CALLBACK_CONFIGS = sorted((CONFIGS / "callbacks").glob("*.yaml"))


def resolve(capsys, *configs) -> dict:
    args = ["fit", "--config", str(CONFIGS / "cifar10.yaml")]
    for config in configs:
        args += ["--config", str(config)]
    with pytest.raises(SystemExit) as exit_info:
        run_command([*args, "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("config", CALLBACK_CONFIGS, ids=lambda p: p.name)
def test_callback_config_stacks(config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    resolved = resolve(capsys, config)
    wanted = [
        c["class_path"] for c in yaml.safe_load(config.read_text()).get("trainer", {}).get("callbacks+", [])
    ]
    got = [c["class_path"].rsplit(".", 1)[-1] for c in resolved["trainer"]["callbacks"] or []]
    assert got == wanted


def test_pruning_qat_and_diagnostics_stack_together(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    names = ["pruning.yaml", "qat.yaml", "diagnostics.yaml", "speed.yaml"]
    resolved = resolve(capsys, *(CONFIGS / "callbacks" / n for n in names))
    got = [c["class_path"].rsplit(".", 1)[-1] for c in resolved["trainer"]["callbacks"]]
    assert got == [
        "ProgressivePruning",
        "QuantizationAwareTraining",
        "UpdateRatioMonitor",
        "ImageThroughputMonitor",
    ]
    assert resolved["trainer"]["precision"] == "32-true"  # from qat.yaml, over the recipe's 16-mixed
    assert resolved["wandb_dashboard"]["init_args"]["watch"] is None
    assert resolved["data_wait"]["init_args"]["synchronize"] is True
