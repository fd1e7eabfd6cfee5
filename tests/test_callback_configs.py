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
    wanted = [  # a config names a class by its short name or its full path
        c["class_path"].rsplit(".", 1)[-1]
        for c in yaml.safe_load(config.read_text()).get("trainer", {}).get("callbacks+", [])
    ]
    got = [c["class_path"].rsplit(".", 1)[-1] for c in resolved["trainer"]["callbacks"] or []]
    assert got == wanted
