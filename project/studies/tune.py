"""`python -m project tune`: a local Optuna hyperparameter search whose every trial is an ordinary `fit`.

The study lives in a real database: SQLite in `<trainer.default_root_dir>/tune/<study>/study.db` by default,
or any SQLAlchemy URL (`--storage postgresql://...`) that several workers share. Each trial runs `python -m
project fit <your flags> <its parameters>` in `trials/trial_<number>/`, with `TrialPruning` in its callbacks
reporting the metric after every validation and stopping the trial when the pruner says so. Rerun the same
command after a kill and the study continues up to `--n_trials` finished (complete or pruned) trials; a trial
that was running when its worker died stops sending Optuna's heartbeat, is marked failed once the grace
period has passed, and is queued again with the same parameters as a new trial, in a new folder.
"""

import json
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from project.atomic_files import check_writable
from project.errors import UserError
from project.run.run_folder import DEFAULT_ROOT_DIR
from project.studies.runner import (
    FitFailed,
    check_produces_metric,
    claim_folder,
    log_table,
    markdown_table,
    parse_fit_args,
    run_fit,
    wandb_env,
    write_results,
)
from project.studies.search import SearchSpace, as_flags, load_search, samples
from project.studies.trial_pruning import PRUNED_ATTR, STORAGE_ENV, Pruner, make_pruner

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class StopAfterFailures:
    """An Optuna callback that stops the study after `limit` failed trials in a row (a bug, not bad luck)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row = limit, 0

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.in_a_row = self.in_a_row + 1 if trial.state == TrialState.FAIL else 0
        if self.in_a_row >= self.limit:
            study.stop()


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    params = {}
    for key, dist in space.params.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            params[key] = trial.suggest_categorical(key, dist.choices)
        elif isinstance(dist, optuna.distributions.IntDistribution):
            params[key] = trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
        else:
            params[key] = trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return params


def check_search(fit_args: list[str], space: SearchSpace) -> None:
    """Every parameter's bounds and choices through `fit`'s parser: a bad key or value names the search file."""
    for values in samples(space):
        try:
            parse_fit_args([*fit_args, *as_flags(values)])
        except UserError as e:
            for key, value in values.items():  # name the value: the parser's first line may not
                try:
                    parse_fit_args([*fit_args, *as_flags({key: value})])
                except UserError as alone:
                    raise UserError(
                        f"search file {space.source}: {key}={value!r} is refused: {alone}"
                    ) from None
            raise UserError(f"search file {space.source}: {e}") from None


def trial_result(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """The trial as its fit left it in the storage (read afresh: the fit is another process)."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def results(
    study: optuna.Study, space: SearchSpace
) -> tuple[list[str], list[list[Any]], list[dict[str, Any]]]:
    """(columns, Markdown rows, JSON records) of every trial, the finished ones best first."""
    sign = -1 if space.direction == "maximize" else 1
    order = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1}
    trials = sorted(
        study.get_trials(deepcopy=False),
        key=lambda t: (order.get(t.state, 2), sign * t.value if t.value is not None else 0, t.number),
    )
    records = [
        {
            "trial": t.number,
            "state": t.state.name,
            space.metric: t.value,
            "params": t.params,
            "validations": len(t.intermediate_values),
            "folder": t.user_attrs.get("folder"),
        }
        for t in trials
    ]
    columns = ["trial", "state", space.metric, *space.params, "validations", "folder"]
    rows = [
        [r["trial"], r["state"], r[space.metric], *(r["params"].get(k) for k in space.params)]
        + [r["validations"], r["folder"]]
        for r in records
    ]
    return columns, rows, records


def open_study(
    name: str, url: str, space: SearchSpace, pruner: optuna.pruners.BasePruner, settings: dict[str, Any]
) -> optuna.Study:
    with warnings.catch_warnings():  # the heartbeat and its retry callback are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(
            url,
            heartbeat_interval=settings["heartbeat_interval"],
            grace_period=settings["grace_period"],
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                settings["retries"]
            ),
        )
    sampler = optuna.samplers.TPESampler(seed=settings["seed"], n_startup_trials=settings["startup_trials"])
    return optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=sampler,
        pruner=pruner,
        direction=space.direction,
        load_if_exists=True,
    )


def tune(
    fit_args: list[str],
    search: str,
    n_trials: int = 20,
    study_name: str | None = None,
    storage: str | None = None,
    pruner: Pruner = "median",
    pruner_startup_trials: int = 5,
    pruner_warmup: int = 0,
    startup_trials: int = 10,
    seed: int | None = None,
    heartbeat_interval: int = 60,
    grace_period: int | None = None,
    retries: int = 1,
    max_failures: int = 3,
    wandb: bool = True,
    wandb_project: str = "lightning-template",
) -> dict[str, Any]:
    """Hyperparameter search with Optuna: every trial an ordinary `python -m project fit` in its own folder.

    Args:
        fit_args: The arguments every trial's `fit` gets (all flags that are not tune's own).
        search: The search file (configs/search/*.yaml): dotted config keys with distributions, metric, direction.
        n_trials: Finished (complete or pruned) trials the study should have; a rerun continues up to it.
        study_name: The study, and its folder `<trainer.default_root_dir>/tune/<study_name>/`. Default: the
            search file's name.
        storage: SQLAlchemy URL of the study's database (e.g. postgresql://user@host/db, shared by workers on
            several machines). Default: sqlite:///<study folder>/study.db.
        pruner: Stop unpromising trials early: `median` (Optuna's MedianPruner), `hyperband` or `none`.
        pruner_startup_trials: Median pruner: prune only once this many trials have finished.
        pruner_warmup: Median pruner: never prune within a trial's first N validations; Hyperband: min_resource.
        startup_trials: Random trials before the TPE sampler starts modelling the results.
        seed: Seed of the sampler (default: random; a fixed seed makes parallel workers propose alike).
        heartbeat_interval: Seconds between a running trial's heartbeats in the storage.
        grace_period: Seconds without a heartbeat after which a running trial counts as dead (failed, and queued
            again); default: twice the heartbeat interval.
        retries: How often a dead trial is queued again with the same parameters (0: never).
        max_failures: Stop the study after this many trials fail in a row (a bug rather than bad settings).
        wandb: Log the trials table to a W&B run (offline unless WANDB_MODE=online) in the trials' group.
        wandb_project: W&B project of that run.
    """
    for flag, value in (
        ("n_trials", n_trials),
        ("max_failures", max_failures),
        ("heartbeat_interval", heartbeat_interval),
    ):
        if value < 1:
            raise UserError(f"--{flag} must be at least 1, got {value}")
    parser, config = parse_fit_args(fit_args)
    from project.cli.config import build_datamodule, task_class

    space = load_search(search, task_class(config.model.class_path))
    check_produces_metric(config, "the study", space.metric, needs_best_checkpoint=False)
    check_search(fit_args, space)
    build_datamodule(config)  # the data's own checks, before any trial
    study_name = study_name or Path(search).stem
    study_dir = Path(config.trainer.default_root_dir or DEFAULT_ROOT_DIR).absolute() / "tune" / study_name
    check_writable(study_dir, "trainer.default_root_dir")
    url = storage or f"sqlite:///{study_dir / 'study.db'}"
    fit = yaml.safe_load(parser.dump(config))
    claim_folder(
        study_dir, {"fit": fit, "search": space.spec, "metric": space.metric}, "the study", "--study_name"
    )
    settings = dict(heartbeat_interval=heartbeat_interval, grace_period=grace_period, retries=retries)
    settings |= dict(seed=seed, startup_trials=startup_trials)
    study = open_study(
        study_name, url, space, make_pruner(pruner, pruner_startup_trials, pruner_warmup), settings
    )

    def objective(trial: optuna.Trial) -> float:
        params = suggest(trial, space)
        folder = study_dir / "trials" / f"trial_{trial.number}"
        if folder.exists():
            raise UserError(f"{folder} exists already, from another study of this name: delete {study_dir}")
        trial.set_user_attr("folder", str(folder))
        callback = {
            "class_path": "project.studies.trial_pruning.TrialPruning",
            "init_args": {"study_name": study_name, "trial_number": trial.number, "monitor": space.metric}
            | {"pruner": pruner, "startup_trials": pruner_startup_trials, "warmup": pruner_warmup},
        }
        args = [*fit_args, *as_flags(params), f"--trainer.callbacks+={json.dumps(callback)}"]
        env = {STORAGE_ENV: url} | wandb_env(
            f"tune-{study_name}", f"{study_name}-trial_{trial.number}", "tune-trial"
        )
        run_fit(args, folder, f"trial {trial.number}", env, resume=False)
        done = trial_result(study, trial.number)
        if PRUNED_ATTR in done.user_attrs:
            raise optuna.TrialPruned(f"after {done.user_attrs[PRUNED_ATTR]} validation(s)")
        if done.last_step is None:
            raise FitFailed(f"trial {trial.number}'s fit reported no {space.metric}")
        return done.intermediate_values[done.last_step]

    finished = len(study.get_trials(deepcopy=False, states=FINISHED))
    if finished < n_trials:
        callbacks = [
            optuna.study.MaxTrialsCallback(n_trials, states=FINISHED),
            StopAfterFailures(max_failures),
        ]
        study.optimize(objective, n_trials=n_trials - finished, catch=(FitFailed,), callbacks=callbacks)
    return write_study(study, space, parser, fit_args, study_dir, wandb, wandb_project)


def write_study(
    study: optuna.Study,
    space: SearchSpace,
    parser: Any,
    fit_args: list[str],
    study_dir: Path,
    wandb: bool,
    wandb_project: str,
) -> dict[str, Any]:
    """The trials table (`trials.md`, `trials.json`) and the best trial's complete config (`best_config.yaml`)."""
    columns, rows, records = results(study, space)
    complete = [r for r in records if r["state"] == "COMPLETE"]
    if not complete:
        raise UserError(f"no trial of {study.study_name} completed: see the trials' output above")
    best = study.best_trial
    _, best_config = parse_fit_args([*fit_args, *as_flags(best.params)])
    best_yaml = f"# Trial {best.number} of study {study.study_name}: {space.metric} = {best.value:.4f}\n"
    best_yaml += parser.dump(best_config)
    text = markdown_table(columns, rows)
    payload = {"study": study.study_name, "metric": space.metric, "direction": space.direction}
    payload |= {"best_trial": best.number, "trials": records}
    write_results(study_dir, "trials", text, payload, {"best_config.yaml": best_yaml})
    print(f"\n{text}\nbest: trial {best.number}, {space.metric} {best.value:.4f}, {best.params}")
    print(f"to train with it: python -m project fit --config {study_dir / 'best_config.yaml'}")
    if wandb:
        summary = {f"best/{space.metric}": best.value, "best/trial": best.number}
        group = f"tune-{study.study_name}"
        print(
            f"W&B run: {log_table('tune/trials', columns, rows, summary, study_dir, wandb_project, group, 'tune-summary')}"
        )
    return payload


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `tune` for a command line (checks it without running anything)."""
    from project.cli.config import parse_tool_args

    return parse_tool_args(tune, args, prog="python -m project tune")


def main(args: list[str]) -> None:
    tune(**parse_args(args))
