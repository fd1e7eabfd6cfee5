"""What `python -m project fit` does before its first training step, kept to what the run needs.

No timing assertions: each test counts what start-up does (full garbage collections, validations of the
config, e-mail parses of package metadata), which does not depend on the machine's load.
"""

import gc
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonargparse
import pytest
import yaml
from lightning.pytorch.callbacks import Callback

from project.callbacks import run_info
from project.callbacks.run_info import name_and_version, package_versions
from project.cli import main, parse_fit_args
from project.cli.config import CommandLine
from tests.conftest import PACKAGE, ROOT, run_python
from tests.fakes import make_image_folder


class StartupProbe(Callback):
    """Writes, at the first training step, the collector's state and how many full collections ran before it.

    Args:
        path: The JSON file to write.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            state = {
                "enabled": gc.isenabled(),
                "frozen": gc.get_freeze_count(),
                "full_collections": gc.get_stats()[2]["collections"],
            }
            Path(self.path).write_text(json.dumps(state))


def fit_args(tmp_path: Path) -> list[str]:
    images = make_image_folder(tmp_path / "images", extras=False)
    args = ["fit", "--config", "configs/folder.yaml", "--data.root", images, "--data.image_size", "16"]
    args += ["--data.cache_dir", tmp_path / "cache", "--model.net", "SimpleCNN", "--trainer.max_steps", "1"]
    args += ["--trainer.default_root_dir", tmp_path / "logs", "--trainer.enable_progress_bar", "false"]
    return [str(a) for a in args]


@pytest.mark.slow
def test_start_up_runs_without_full_garbage_collections_and_training_with_them(tmp_path):
    out = tmp_path / "probe.json"
    args = [*fit_args(tmp_path), "--trainer.callbacks+=tests.test_startup.StartupProbe"]
    args += ["--trainer.callbacks.path", str(out)]
    run_python("-m", PACKAGE, *args)
    state = json.loads(out.read_text())
    # Imports and parsing walked millions of objects in each full collection; training collects as usual, past
    # the objects start-up built (frozen, and shared with the forked loader workers).
    assert state["full_collections"] == 0, state
    assert state["enabled"] and state["frozen"] > 100_000, state


@pytest.mark.slow
def test_the_installed_environment_starts_lightning_without_a_plotting_library():
    # Where matplotlib is installed, importing Lightning imports matplotlib.pyplot (torchmetrics' plotting
    # module does), in every command: it is the `plots` extra, not a dependency of the core.
    probe = (
        "import sys, project.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    )
    assert run_python("-c", probe).stdout.strip() == "[]"


def test_a_tool_runs_with_the_collector_on(tmp_path, monkeypatch):
    import project.cli as cli
    from project.run import startup

    monkeypatch.setitem(cli.TOOLS, "probe", ("tests.test_startup:record_collector", ""))
    SEEN.clear()
    startup.pause_garbage_collection()
    try:
        cli.main(["probe"])
    finally:
        startup.resume_garbage_collection()
        gc.enable()
    assert SEEN == {"enabled": True}


SEEN: dict[str, bool] = {}


def record_collector(args: list[str]) -> None:
    SEEN["enabled"] = gc.isenabled()


@pytest.mark.slow
def test_a_fit_dumps_its_config_twice_and_never_validating_it_again(tmp_path, monkeypatch):
    """Parsing validated the config: a fit dumps it once for the run's plan and the task's saved hyperparameters
    (LightningCLI's instantiators read that dump instead of making their own) and once for config.yaml, and
    neither dump checks anything anew (each validation rebuilds the parser of every class in the config)."""
    dumps = []
    original = jsonargparse.ArgumentParser.dump

    def recording(self: Any, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        while caller.f_code.co_filename.endswith("_deprecated.py"):  # jsonargparse's own wrapper
            caller = caller.f_back
        if "jsonargparse" not in caller.f_code.co_filename:  # (its own, of a nested class's settings)
            dumps.append((Path(caller.f_code.co_filename).name, bool(kwargs.get("skip_validation"))))
        return original(self, cfg, *args, **kwargs)

    monkeypatch.setattr(jsonargparse.ArgumentParser, "dump", recording)
    monkeypatch.chdir(ROOT)
    main(fit_args(tmp_path))
    assert (tmp_path / "logs" / "runs" / "version_0" / "config.yaml").is_file()
    assert dumps == [("config.py", True), ("save_config.py", True)]


@pytest.mark.parametrize("config", ["folder.yaml", "cifar10.yaml"])
def test_the_config_read_back_from_its_json_dump_is_the_yaml_one(config, tmp_path):
    """The plan reads the parsed config back from a JSON dump (read in C): the same values as from YAML."""
    given = {"folder.yaml": ["--data.root", str(tmp_path)]}
    command = CommandLine("fit", ["--config", str(ROOT / "configs" / config), *given.get(config, [])])
    text = command.parser.dump(
        command.config, skip_unset=False, skip_link_targets=False, skip_validation=True
    )
    assert command.dumped == yaml.safe_load(text)


@pytest.mark.parametrize("config", ["folder.yaml", "cifar10.yaml"])
def test_dumping_without_validation_writes_the_same_config(config, tmp_path):
    root = ["--data.root", str(tmp_path)] if config == "folder.yaml" else []
    parser, cfg = parse_fit_args(["--config", str(ROOT / "configs" / config), *root])
    for links in (True, False):
        checked = parser.dump(cfg, skip_unset=False, skip_link_targets=links)
        assert parser.dump(cfg, skip_unset=False, skip_link_targets=links, skip_validation=True) == checked


def test_package_versions_are_read_from_the_metadata_headers(monkeypatch):
    expected = {d.metadata["Name"].lower(): d.version for d in metadata.distributions() if d.metadata["Name"]}

    def parsed_whole(self: Any) -> Any:
        raise AssertionError("a METADATA file parsed whole as an e-mail message")

    monkeypatch.setattr(metadata.Distribution, "metadata", property(parsed_whole))
    assert package_versions() == dict(sorted(expected.items()))
    assert run_info.collect_run_info()["key_packages"]["lightning"] == expected["lightning"]


def test_name_and_version_stop_at_the_end_of_the_header():
    text = "Metadata-Version: 2.1\nName: Some-Pkg\nVersion: 1.2.3\n\nName: not this\nVersion: 9\n"
    assert name_and_version(text) == ("Some-Pkg", "1.2.3")
    assert name_and_version("") == (None, None)
