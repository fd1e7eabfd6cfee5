"""Hyperparameter search: search files, the pruning callback, the best config, and `python -m project tune`.

Fast tests run in-process (bad search files, the callback in a tiny fit, the written best config); the slow
ones run real studies of three tiny trials, one of them killed in its second trial and resumed.
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import optuna
import psutil
import pytest
import torch
import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

from project.cli import fit_parser, main, run_command
from project.studies.search import as_flags, check_search, load_search
from project.studies.trial_pruning import PRUNED_ATTR, STORAGE_ENV, TrialPruning
from project.studies.tune import parse_args
from project.studies.tune_results import write_study
from tests import docs_pages
from tests.conftest import CONFIGS, ROOT, run_cli, subprocess_env
from tests.folder_fits import tiny_fit_args, tiny_folder

GOOD = "model.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\n"


def _one_error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        (None, r"search file .*missing.yaml does not exist"),
        ("a: [1, 2\n", r"search file .* is not valid YAML"),
        (
            "model.label_smoothing: {type: uniform, low: 0, high: 1}\n",
            r"model.label_smoothing: type must be float, int or categorical, got 'uniform'",
        ),
        (
            "model.label_smoothing: {type: float, low: 0.5, high: 0.1}\n",
            r"model.label_smoothing: `low <= high` must hold, but got \(low=0.5, high=0.1\)",
        ),
        (
            "model.optimizer.init_args.lr: {type: float, low: 0, high: 1, log: true}\n",
            r"model.optimizer.init_args.lr: `low > 0` must hold for `log=True`",
        ),
        (
            "model.label_smoothing: {type: float, low: 0, high: 1, lg: true}\n",
            r"model.label_smoothing: unknown field\(s\) lg for type float",
        ),
        (
            "model.label_smoothing: {type: float, low: x, high: 1}\n",
            r"model.label_smoothing.low: 'x' is not a number",
        ),
        ("data.batch_size: {type: int, low: 8.5, high: 16}\n", r"data.batch_size.low: 8.5 is not an integer"),
        (
            "model.net: {type: categorical, choices: []}\n",
            r"model.net: categorical needs a non-empty list of choices",
        ),
        ("lr: {type: float, low: 0.1, high: 1}\n", r"'lr' is not a dotted config key"),
        (GOOD + "direction: up\n", r"direction must be maximize or minimize, got 'up'"),
        (GOOD + "metric: acc\n", r"metric must be a logged metric such as val/acc_best, got 'acc'"),
        ("metric: val/loss\n", r"names no config key to search"),
        ("model.nott_a_key: {type: float, low: 0.1, high: 1}\n", r"search file .*: .*nott_a_key"),
        (
            "trainer.max_epochs: {type: float, low: 0.5, high: 2.5}\n",
            r"search file .*: trainer.max_epochs=0.5 is refused: .*trainer.max_epochs",
        ),
        (
            "model.net: {type: categorical, choices: [SimpleCNN, NotANet]}\n",
            r"search file .*: model.net='NotANet' is refused: Parser key \"model.net\"",
        ),
    ],
)
def test_a_bad_search_file_is_one_line_naming_what_is_wrong(search, expected, tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    path = tmp_path / "missing.yaml" if search is None else tmp_path / "search.yaml"
    if search is not None:
        path.write_text(search)
    line = _one_error_line([*tiny_fit_args(data, tmp_path), "--search", str(path)], capsys)
    assert line.startswith("error: ") and re.search(expected, line), line
    assert not (tmp_path / "logs").exists()  # no study was created


SEARCHED_CONFIGS = {
    "cifar10": ["cifar10.yaml"],
    "cifar100": ["cifar100.yaml"],
    "folder": ["folder.yaml"],
    "folder_simplecnn": ["folder.yaml", "experiment/folder_simplecnn.yaml"],
    "photos": ["folder.yaml", "experiment/photos.yaml"],
    "photos_finetune": ["folder.yaml", "experiment/photos_finetune.yaml"],
}


@pytest.mark.parametrize("name", SEARCHED_CONFIGS)
def test_every_shipped_search_file_fits_its_config(name, tmp_path):
    space = load_search(CONFIGS / "search" / f"{name}.yaml")
    assert space.metric == "val/acc_best" and space.direction == "maximize" and len(space.params) >= 3
    args = [a for config in SEARCHED_CONFIGS[name] for a in ("--config", str(CONFIGS / config))]
    args += (
        ["--data.root", str(tiny_folder(tmp_path / "images"))]
        if name.startswith(("folder", "photos"))
        else []
    )
    # This machine cannot download weights: the search space is checked on the same network, randomly initialised.
    args += ["--model.net.init_args.pretrained", "false"] if name == "photos_finetune" else []
    check_search(args, space)  # every bound and choice parses as a `fit` value
    assert "#" in (CONFIGS / "search" / f"{name}.yaml").read_text().splitlines()[0]  # says what and why


class ConstantMetric(L.LightningModule):
    """Logs a fixed `val/acc_best` every validation: a trial as good or as bad as the test wants."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value, self.layer = value, torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc_best", self.value)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)

    val_dataloader = train_dataloader


@pytest.mark.parametrize(("value", "pruned"), [(0.2, True), (0.9, False)])
def test_trial_pruning_stops_a_trial_below_the_median_and_lets_a_good_one_run(
    value, pruned, tmp_path, monkeypatch
):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for _ in range(2):  # two finished trials at 0.5 after each of their 3 validations
        study.add_trial(
            optuna.trial.create_trial(
                value=0.5, intermediate_values={1: 0.5, 2: 0.5, 3: 0.5}, params={}, distributions={}
            )
        )
    trial = study.ask()
    monkeypatch.setenv(STORAGE_ENV, url)
    callback = TrialPruning("s", trial.number, pruner="median", startup_trials=2)
    trainer = L.Trainer(
        max_epochs=3, callbacks=[callback], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(ConstantMetric(value))
    stored = next(t for t in study.get_trials() if t.number == trial.number)
    assert trainer.current_epoch == (1 if pruned else 3)  # stopped after its first epoch, or ran them all
    assert stored.intermediate_values == pytest.approx(
        {1: value} if pruned else {1: value, 2: value, 3: value}
    )
    assert stored.user_attrs.get(PRUNED_ATTR) == (1 if pruned else None)


def test_the_best_config_is_the_users_config_with_the_best_parameters(tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    fit_args = tiny_fit_args(data, tmp_path)
    space_file = tmp_path / "search.yaml"
    space_file.write_text(GOOD + "model.label_smoothing: {type: categorical, choices: [0.0, 0.2]}\n")
    space = load_search(space_file)
    study = optuna.create_study(study_name="s", direction="maximize")
    for lr, smoothing, value in [(0.001, 0.0, 0.5), (0.02, 0.2, 0.8), (0.05, 0.0, 0.6)]:
        study.add_trial(
            optuna.trial.create_trial(
                value=value,
                params={"model.optimizer.init_args.lr": lr, "model.label_smoothing": smoothing},
                distributions=space.params,
                user_attrs={"folder": f"trial_{lr}"},
            )
        )
    payload = write_study(
        study, space, fit_parser(), fit_args, tmp_path / "study", wandb=False, wandb_project="p"
    )
    assert [t["trial"] for t in payload["trials"]] == [1, 2, 0] and payload["best_trial"] == 1
    best = tmp_path / "study" / "best_config.yaml"
    parser = fit_parser()
    expected = parser.parse_args([*fit_args, *as_flags(study.best_params)])
    written = parser.parse_args(["--config", str(best)])
    assert (
        written.model.init_args.optimizer.init_args.lr == 0.02
        and written.model.init_args.label_smoothing == 0.2
    )
    assert yaml.safe_load(parser.dump(written)) == yaml.safe_load(parser.dump(expected))
    with pytest.raises(SystemExit) as exit_info:  # and `fit --config <it>` takes it unchanged
        run_command(["fit", "--config", str(best), "--print_config"])
    assert exit_info.value.code in (0, None)
    assert "| 1 | COMPLETE | 0.8000 | 0.0200 | 0.2000 |" in (tmp_path / "study" / "trials.md").read_text()
    assert json.loads((tmp_path / "study" / "trials.json").read_text())["best_trial"] == 1


def test_tune_flags_are_its_own_and_the_rest_goes_to_fit(capsys):
    kwargs = parse_args(["--config", "a.yaml", "--search", "s.yaml", "--n_trials", "3", "--model.net", "MLP"])
    assert kwargs["search"] == "s.yaml" and kwargs["n_trials"] == 3 and kwargs["pruner"] == "median"
    assert kwargs["fit_args"] == ["--config", "a.yaml", "--model.net", "MLP"]
    with pytest.raises(SystemExit):
        parse_args(["--search", "s.yaml", "--pruner", "sometimes"])


def test_each_fit_of_a_study_gets_its_own_wandb_service(tmp_path, monkeypatch):
    from project.studies import runner

    seen = {}

    class Finished:
        def __init__(self, command, env, **kwargs):
            seen.update(env)

        def wait(self):
            return 0

    monkeypatch.setenv("WANDB_SERVICE", "unix-1234-/tmp/wandb.sock")  # what wandb sets once it ran here
    monkeypatch.setattr(runner.subprocess, "Popen", Finished)
    runner.run_fit(["--model.net", "MLP"], tmp_path, "trial 0", {"WANDB_NAME": "trial-0"}, resume=False)
    assert seen["WANDB_NAME"] == "trial-0" and "WANDB_SERVICE" not in seen


def test_the_readme_lines_that_start_studies_on_slurm_or_many_gpus_parse(tmp_path):
    """The `python -m project cv|tune` commands inside the pages' sbatch and shell-loop lines and their prose (the
    lines that start with `python -m project` are parsed by tests/test_readme.py)."""
    from project.studies import cv
    from project.studies.runner import parse_fit_args

    embedded = []
    for line in docs_pages.text().splitlines():
        if not line.startswith("python -m project ") and (
            found := re.search(r"python -m project (cv|tune) [^'&`]*", line)
        ):
            embedded.append(found.group(0).replace("$SLURM_ARRAY_TASK_ID", "3"))
    assert len(embedded) >= 3 and {c.split()[3] for c in embedded} == {"cv", "tune"}
    for command in embedded:
        args = command.split()[4:]
        kwargs = (cv.parse_args if command.split()[3] == "cv" else parse_args)(args)
        parse_fit_args(kwargs["fit_args"])  # what goes to every fit parses as `fit`'s arguments
        if "--folds_to_run" in args:
            assert cv.fold_numbers(kwargs["folds"], kwargs["folds_to_run"]) == [3]


# -- end to end ----------------------------------------------------------------------------------------------
def _study(root: Path, name: str) -> optuna.Study:
    return optuna.load_study(
        study_name=name, storage=f"sqlite:///{root / 'logs' / 'tune' / name / 'study.db'}"
    )


def _trial_config(folder: Path) -> dict:
    (path,) = folder.rglob("config.yaml")
    return yaml.safe_load(path.read_text())


def _set(config):
    if isinstance(config, dict):
        return {k: _set(v) for k, v in config.items() if v is not None}
    return [_set(v) for v in config] if isinstance(config, list) else config


@pytest.mark.slow
def test_a_three_trial_study_prunes_the_bad_trial_and_its_best_config_reproduces_the_best(tmp_path):
    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(
        "metric: val/loss\ndirection: minimize\n"
        "model.optimizer.init_args.lr: {type: categorical, choices: [0.01, 1.0e-9]}\n"
    )
    study_dir = tmp_path / "logs" / "tune" / "lr"
    study_dir.mkdir(parents=True)
    # Two good trials, then one that cannot learn: the median pruner (after 2 trials) stops it after epoch 1.
    queued = optuna.create_study(
        study_name="lr", storage=f"sqlite:///{study_dir / 'study.db'}", direction="minimize"
    )
    for lr in (0.01, 0.01, 1e-9):
        queued.enqueue_trial({"model.optimizer.init_args.lr": lr})
    fit_args = tiny_fit_args(
        data, tmp_path, "--model.scheduler", "null", "--trainer.max_epochs", "3", "--trainer.logger", "false"
    )
    proc = run_cli(
        "tune",
        *fit_args,
        "--search",
        search,
        "--n_trials",
        "3",
        "--pruner_startup_trials",
        "2",
        "--wandb",
        "false",
        cwd=tmp_path,
    )

    trials = _study(tmp_path, "lr").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert [len(t.intermediate_values) for t in trials] == [3, 3, 1]  # the pruned trial stopped early
    assert trials[2].intermediate_values[1] > trials[0].intermediate_values[1]
    records = json.loads((study_dir / "trials.json").read_text())["trials"]
    assert [(r["trial"], r["state"]) for r in records] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "PRUNED")]
    assert (
        "| 2 | PRUNED |" in (study_dir / "trials.md").read_text() and "trial 2 pruned" in proc.stderr.lower()
    )

    # The best config is the best trial's config, less what belongs to the trial (its folder, the callback).
    best = yaml.safe_load((study_dir / "best_config.yaml").read_text())
    ran = _trial_config(study_dir / "trials" / "trial_0")
    assert ran["trainer"]["default_root_dir"].endswith("trial_0") and ran["trainer"]["callbacks"]
    assert (
        best["trainer"].pop("default_root_dir") == str(tmp_path / "logs")
        and best["trainer"].pop("callbacks", None) is None
    )
    ran["trainer"].pop("default_root_dir"), ran["trainer"].pop("callbacks")
    ran.pop("ckpt_path", None), ran.pop("weights_only")  # how `fit` loads a checkpoint, set by the CLI
    # A trial tests nothing; a fit of the best config tests its best checkpoint as any fit does.
    assert ran.pop("test_after_fit") is False and best.pop("test_after_fit") is True
    assert _set(best) == _set(ran)  # the saved config spells out the unset (null) values too
    with pytest.raises(SystemExit) as exit_info:
        run_command(["fit", "--config", str(study_dir / "best_config.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)


@pytest.mark.slow
def test_a_study_killed_in_its_second_trial_finishes_on_rerun_counting_no_trial_twice(tmp_path):
    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(GOOD)
    args = ["tune", *tiny_fit_args(data, tmp_path, "--trainer.logger", "false"), "--search", str(search)]
    args += [
        "--n_trials",
        "3",
        "--pruner",
        "none",
        "--heartbeat_interval",
        "1",
        "--grace_period",
        "2",
        "--wandb",
        "false",
    ]
    env = subprocess_env()
    tune = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "patched_main.py"), *args], cwd=tmp_path, env=env
    )
    trials = tmp_path / "logs" / "tune" / "lr" / "trials"
    deadline = time.monotonic() + 240
    while not (trials / "trial_1").exists():
        assert tune.poll() is None and time.monotonic() < deadline, "the study ended before its second trial"
        time.sleep(0.2)
    fits = psutil.Process(tune.pid).children(recursive=True)
    tune.send_signal(signal.SIGKILL)
    tune.wait()
    psutil.wait_procs(fits, timeout=120)  # the orphaned fit got SIGTERM (it dies with its study) and stopped
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in fits)
    time.sleep(3)  # past the grace period: the killed trial's heartbeat is stale

    run_cli(*args, cwd=tmp_path)
    study = _study(tmp_path, "lr")
    states = {t.number: t.state for t in study.get_trials()}
    assert states[1] == TrialState.FAIL  # the killed trial: failed, not counted
    finished = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(finished) == 3 and 1 not in [t.number for t in finished]
    (retry,) = [t for t in finished if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == 1]
    assert retry.params == next(t for t in study.get_trials() if t.number == 1).params
    # The retry continues the killed trial's run in its folder, from the last.ckpt its fit saved on the way out.
    assert retry.user_attrs["folder"] == str(trials / "trial_1")
    records = json.loads((trials.parent / "trials.json").read_text())["trials"]
    assert sorted(r["trial"] for r in records if r["state"] == "COMPLETE") == sorted(
        t.number for t in finished
    )
    assert {r["trial"]: r["state"] for r in records}[
        1
    ] == f"FAIL (its worker stopped), continued by trial {retry.number}"


def test_the_default_objective_is_the_tasks_monitored_metric(tmp_path):
    """A search file without `metric` optimises the best value of what the task monitors, in its direction."""

    class Regression:
        monitor, monitor_mode = "val/mae", "min"

    space_file = tmp_path / "search.yaml"
    space_file.write_text("model.label_smoothing: {type: float, low: 0.0, high: 0.2}\n")
    from project.tasks import ImageClassifier

    assert (
        load_search(space_file, ImageClassifier).metric,
        load_search(space_file, ImageClassifier).direction,
    ) == (
        "val/acc_best",
        "maximize",
    )
    space = load_search(space_file, Regression)
    assert (space.metric, space.direction) == ("val/mae_best", "minimize")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["--trainer.limit_val_batches", "0"],
            r"^error: trainer.limit_val_batches=0: the runs would never valid",
        ),
        (
            ["--trainer.max_epochs", "2", "--trainer.check_val_every_n_epoch", "5"],
            r"^error: trainer.check_val_every_n_epoch=5 with trainer.max_epochs=2: .*no run of the study would "
            r"produce its val/acc_best$",
        ),
    ],
)
def test_settings_that_never_validate_are_one_line_before_any_trial(extra, expected, tmp_path, capsys):
    data = tiny_folder(tmp_path / "images")
    search = tmp_path / "lr.yaml"
    search.write_text(GOOD)
    line = _one_error_line([*tiny_fit_args(data, tmp_path, *extra), "--search", str(search)], capsys)
    assert re.search(expected, line), line
    assert not (tmp_path / "logs").exists()  # no study was started


@pytest.mark.slow
def test_a_trial_whose_max_steps_ends_within_an_epoch_completes(tmp_path):
    data = tiny_folder(tmp_path / "images")  # 3 training batches an epoch
    search = tmp_path / "lr.yaml"
    search.write_text(GOOD)
    fit_args = tiny_fit_args(data, tmp_path, "--trainer.max_steps", "2", "--trainer.logger", "false")
    run_cli(
        "tune",
        *fit_args,
        "--search",
        search,
        "--n_trials",
        "1",
        "--pruner",
        "none",
        "--wandb",
        "false",
        cwd=tmp_path,
    )
    (trial,) = _study(tmp_path, "lr").get_trials()
    assert trial.state == TrialState.COMPLETE and len(trial.intermediate_values) == 1


def test_sweep_config_resolves_to_a_valid_fit_command(capsys, monkeypatch):
    sweep = yaml.safe_load((CONFIGS / "sweeps" / "cifar10.yaml").read_text())
    assert sweep["method"] == "bayes" and sweep["metric"] == {"name": "val/acc_best", "goal": "maximize"}
    values = {}
    for name, spec in sweep["parameters"].items():
        values[name] = spec["values"][-1] if "values" in spec else spec["max"]
    # What `wandb agent` runs: ${env} and the NAME=VALUE after it set the environment, ${args} are the flags.
    command = sweep["command"]
    assert command[:2] == ["${env}", "WANDB_MODE=online"] and command[2:5] == ["python", "-m", "project"]
    flags = create_sweep_command_args({"args": {k: {"value": v} for k, v in values.items()}})["args"]
    args = [a for a in command[5:] if a != "${args}"] + flags + ["--print_config"]
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_command(args)
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    config = yaml.safe_load(capsys.readouterr().out)
    assert (
        config["model"]["init_args"]["scheduler"]["init_args"]["max_lr"]
        == values["model.scheduler.init_args.max_lr"]
    )
    assert (
        config["model"]["init_args"]["optimizer"]["init_args"]["weight_decay"]
        == values["model.optimizer.init_args.weight_decay"]
    )
    assert config["model"]["init_args"]["label_smoothing"] == values["model.label_smoothing"]
    assert config["trainer"]["max_epochs"] == 15 and config["wandb_dashboard"]["init_args"]["watch"] is None


def test_the_documented_sweeps_are_the_tested_one():
    sweeps = [line.split()[-1] for _, line in docs_pages.shell_lines() if line.startswith("wandb sweep ")]
    assert sweeps == ["configs/sweeps/cifar10.yaml"]  # what test_sweep_config_resolves_... resolves


def test_the_documented_postgresql_url_has_its_driver_installed():
    """The docs' `--storage postgresql://...` works as written with the `postgres` extra: SQLAlchemy maps the
    bare URL to psycopg 3, which the extra installs (psycopg2 would not be found)."""
    import sqlalchemy

    urls = re.findall(r"--storage (postgresql[^\s']*)", docs_pages.text())
    assert urls
    for url in urls:
        dialect = sqlalchemy.engine.make_url(url).get_dialect()
        assert dialect.driver == "psycopg", (url, dialect.driver)
        dialect.import_dbapi()  # the driver itself is installed
