"""Every `python -m project ...` command in the README parses (the end-to-end tests run their equivalents)."""

import shlex

import pytest
import yaml

from project.cli import TOOLS, ProjectCLI
from tests.conftest import ROOT

COMMANDS = [
    line.split("  #")[0].strip()
    for line in (ROOT / "README.md").read_text().splitlines()
    if line.strip().startswith("python -m project ")
]


def test_readme_has_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command, image_folder, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = shlex.split(command.replace("path/to/images", str(image_folder)))[3:]
    # Tool commands are run by their own tests (tests/test_export.py, test_serve.py, ...); here they parse.
    if args[0] in TOOLS:
        module = __import__(TOOLS[args[0]][0].split(":")[0], fromlist=["parse_args"])
        kwargs = module.parse_args(args[1:])  # every flag known and well typed; nothing is run
        given = dict(zip(args[1::2], args[2::2], strict=False))
        assert {k: str(kwargs[k[2:]]) for k in given if k != "--config"} == {
            k: v for k, v in given.items() if k != "--config"
        }
        return
    args = [a for a in args if a != "--print_config"] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        ProjectCLI(args=args)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    assert "model" in yaml.safe_load(capsys.readouterr().out)
