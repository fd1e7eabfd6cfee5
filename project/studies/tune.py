"""`python -m project tune`: a local Optuna hyperparameter search whose every trial is an ordinary `fit`.

The study lives in a real database: SQLite in `<trainer.default_root_dir>/tune/<study>/study.db` by default,
or any SQLAlchemy URL (`--storage postgresql://...`) that several workers share (project.studies.storage opens
it; what goes wrong with it is one `error:` line). Each trial runs `python -m project fit <your flags> <its
parameters>` in `trials/trial_<number>/`, with `TrialPruning` in its callbacks reporting the metric after every
validation and stopping the trial when the pruner says so. `--n_trials` counts over every worker: a worker
starts a trial only while fewer trials are finished (complete or pruned) or running. Rerun the same command
after a stop and the study continues up to it. A trial stopped by Ctrl-C or SIGTERM (its fit saves last.ckpt)
is marked INTERRUPTED and continued by a new trial with its parameters, folder and reports, from that
checkpoint; a trial whose worker died stops sending Optuna's heartbeat, is marked failed once the grace period
has passed, and is continued the same way (`--retries` times). `trials.md`, `trials.json` and
`best_config.yaml` are written from the storage's state, whole and one worker at a time.
"""

import fcntl
import json
import logging
import signal
import sys
import threading
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
    SETTINGS_FILE,
    FitFailed,
    Interrupted,
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
from project.studies.storage import database_error, lost, open_storage
from project.studies.trial_pruning import (
    METRIC_MISSING_ATTR,
    PRUNED_ATTR,
    STORAGE_ENV,
    TRIAL_ENV,
    Pruner,
    make_pruner,
)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
#: The user attribute of a trial stopped by Ctrl-C or SIGTERM (its fit saved last.ckpt; a new trial continues it).
INTERRUPTED_ATTR = "interrupted"


def _database_errors_said_once(hook: Any) -> Any:
    """A `threading.excepthook` that passes over database errors in Optuna's heartbeat thread: the study's
    main thread meets the same lost database and says so, in one line."""

    def quiet(args: Any) -> None:
        if database_error(args.exc_value) is None:
            hook(args)

    return quiet


def _optuna_says_one_line(record: logging.LogRecord) -> bool:
    """Optuna's report of a failed trial, without its traceback (the fit's own output names the cause); none
    for an error the study stops on, which is printed as the study's one `error:` line."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, UserError) and not isinstance(error, FitFailed):
        return False
    if "failed with value None" in record.getMessage():
        return False
    record.exc_info, record.exc_text = None, None
    return True


class StopAfterFailures:
    """An Optuna callback that stops the study after `limit` failed trials in a row (a bug, not bad luck)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row, self.stopped = limit, 0, False

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.in_a_row = self.in_a_row + 1 if trial.state == TrialState.FAIL else 0
        if self.in_a_row >= self.limit:
            self.stopped = True
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


def _refused(fit_args: list[str], values: dict[str, Any]) -> str | None:
    """Why `fit` refuses these parameter values: its parser, then the `__init__` of the sections they set (a
    task's or DataModule's own range checks, such as label_smoothing in [0, 1)); None if it accepts them."""
    from project.cli.config import instantiate_section
    from project.data import ImageDataModule
    from project.lit import ImageTask

    try:
        _, config = parse_fit_args([*fit_args, *as_flags(values)])
        sections = {key.split(".", 1)[0] for key in values}
        if "model" in sections:
            instantiate_section("model", ImageTask, config.model)
        if "data" in sections:
            instantiate_section("data", ImageDataModule, config.data)
    except UserError as e:
        return str(e)
    except Exception as e:  # a check in an __init__ that raises a plain error: its own words
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        listed = [line[2:] for line in lines if line.startswith("- ")]
        return (listed or lines or [type(e).__name__])[0]
    return None


def check_search(fit_args: list[str], space: SearchSpace) -> None:
    """Every parameter's bounds and choices through `fit`'s parser and the `__init__` of what they set: a bad
    key or value names the search file, before any trial trains."""
    for values in samples(space):
        why = _refused(fit_args, values)
        if why is None:
            continue
        for key, value in values.items():  # name the value: the first refusal may not
            alone = _refused(fit_args, {key: value})
            if alone is not None:
                raise UserError(f"search file {space.source}: {key}={value!r} is refused: {alone}")
        raise UserError(f"search file {space.source}: {why}")


def trial_result(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    """The trial as its fit left it in the storage (read afresh: the fit is another process)."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def heartbeat_ages(study: optuna.Study) -> dict[int, float]:
    """Seconds since each running trial's last heartbeat (trial number -> age), by the database's clock."""
    storage = study._storage
    if not isinstance(storage, optuna.storages.RDBStorage):
        return {}
    import sqlalchemy
    from optuna.storages._rdb import models

    ages = {}
    with lost(storage.url, f"the study {study.study_name}"):
        session = storage.scoped_session()
        try:
            now = session.execute(sqlalchemy.func.now()).scalar()
            running = (
                session.query(models.TrialModel)
                .filter(models.TrialModel.state == TrialState.RUNNING)
                .filter(models.TrialModel.study_id == study._study_id)
                .all()
            )
            for trial in running:
                if trial.heartbeats and now is not None:
                    beat = trial.heartbeats[0].heartbeat
                    ages[trial.number] = (
                        now.replace(tzinfo=None) - beat.replace(tzinfo=None)
                    ).total_seconds()
        finally:
            session.close()
    return ages


def state_label(
    trial: optuna.trial.FrozenTrial, trials: list[optuna.trial.FrozenTrial], ages: dict[int, float]
) -> str:
    """The trial's state as it is: a trial stopped by Ctrl-C or whose worker died says so and names the trial
    that continues it; a running one says how old its last heartbeat is (its worker may be gone)."""
    later = [t.number for t in trials if t.system_attrs.get("retry_history", [])[-1:] == [trial.number]]
    continued = f", continued by trial {later[0]}" if later else ""
    if trial.state == TrialState.FAIL and trial.user_attrs.get(INTERRUPTED_ATTR):
        return f"INTERRUPTED{continued}"
    if trial.state == TrialState.FAIL and later:
        return f"FAIL (its worker stopped){continued}"
    if trial.state == TrialState.RUNNING and trial.number in ages:
        return f"RUNNING (last heartbeat {ages[trial.number]:.0f} s ago)"
    history = trial.system_attrs.get("retry_history", [])
    if trial.state == TrialState.WAITING and history:
        return f"WAITING (continues trial {history[-1]} when tune runs again)"
    return trial.state.name


def results(
    study: optuna.Study, space: SearchSpace
) -> tuple[list[str], list[list[Any]], list[dict[str, Any]]]:
    """(columns, Markdown rows, JSON records) of every trial, the finished ones best first."""
    sign = -1 if space.direction == "maximize" else 1
    order = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1}
    # (A trial given back unrun, with nothing of its own yet, is not one of the study's trials.)
    every = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING or t.params]
    ages = heartbeat_ages(study)
    trials = sorted(
        every,
        key=lambda t: (order.get(t.state, 2), sign * t.value if t.value is not None else 0, t.number),
    )
    records = [
        {
            "trial": t.number,
            "state": state_label(t, every, ages),
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
    """The study in its storage (created on first use); a storage that cannot be opened is one UserError."""
    with warnings.catch_warnings():  # the heartbeat and its retry callback are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(
            settings["retries"], inherit_intermediate_values=True
        )
    storage = open_storage(
        url,
        heartbeat_interval=settings["heartbeat_interval"],
        grace_period=settings["grace_period"],
        heartbeat_stale_trial_callback=retry,
    )
    sampler = optuna.samplers.TPESampler(seed=settings["seed"], n_startup_trials=settings["startup_trials"])
    with lost(url, f"the study {name}"):
        return optuna.create_study(
            storage=storage,
            study_name=name,
            sampler=sampler,
            pruner=pruner,
            direction=space.direction,
            load_if_exists=True,
        )


def _remove_new_study_folder(study_dir: Path, created: Path) -> None:
    """Undo what this command made of a new study folder (its recorded settings), and the folders above it it
    created, each only while empty: another worker may have started there meanwhile."""
    (study_dir / SETTINGS_FILE).unlink(missing_ok=True)
    for folder in [study_dir, *study_dir.parents]:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): what is in it is not ours
            return
        if folder == created:
            return


def trials_taken(study: optuna.Study) -> int:
    """Trials that count towards `n_trials` now: finished ones and those running in some worker (a trial
    whose worker died, once its grace period has passed, is failed here and queued to be continued)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return len(study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING)))


class Surplus(SystemExit):
    """The trial just asked for is one more than `n_trials`: another worker asked at the same moment. Given
    back to the study as WAITING, unrun (not an `Exception`: Optuna records nothing for it)."""


def give_back_if_surplus(study: optuna.Study, trial: optuna.Trial, n_trials: int) -> None:
    """Trials are numbered in the order the database hands them out: if `n_trials` lower-numbered ones are
    finished or running, this one is not needed, goes back to the queue (a later, larger study may run it),
    and `Surplus` ends this worker's loop."""
    taken = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
    if sum(t.number < trial.number for t in taken) >= n_trials:
        study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
        raise Surplus(0)


def interrupted(study: optuna.Study, trial: optuna.Trial) -> None:
    """Record a trial stopped by Ctrl-C or SIGTERM (its fit saved last.ckpt) as such, and queue a trial with
    its parameters, folder and reports, which continues it from that checkpoint on the next run."""
    storage = study._storage
    storage.set_trial_user_attr(trial._trial_id, INTERRUPTED_ATTR, True)
    storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(None, inherit_intermediate_values=True)
    frozen = storage.get_trial(trial._trial_id)
    retry(study, frozen)


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
        n_trials: Finished (complete or pruned) trials the study should have, over all its workers: a worker
            starts a trial only while fewer than this are finished or running (one asked for by two workers
            at the same moment is given back unrun); a rerun continues up to it.
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
        grace_period: Seconds without a heartbeat after which a running trial counts as dead (failed, and
            continued by a new trial); default: twice the heartbeat interval.
        retries: How often a dead trial is continued by a new trial with its parameters and folder, from its
            last.ckpt (0: never). A trial stopped by Ctrl-C or SIGTERM is always continued.
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
    settings = dict(heartbeat_interval=heartbeat_interval, grace_period=grace_period, retries=retries)
    settings |= dict(seed=seed, startup_trials=startup_trials)
    # The outermost folder this command would create: removed again if the storage is refused.
    created = next((p for p in reversed([study_dir, *study_dir.parents]) if not p.exists()), None)
    try:  # a study whose storage cannot be opened leaves no folder behind
        if storage is None:
            study_dir.mkdir(parents=True, exist_ok=True)
        claim_folder(
            study_dir, {"fit": fit, "search": space.spec, "metric": space.metric}, "the study", "--study_name"
        )
        study = open_study(
            study_name, url, space, make_pruner(pruner, pruner_startup_trials, pruner_warmup), settings
        )
    except BaseException:
        if created is not None:
            _remove_new_study_folder(study_dir, created)
        raise

    def objective(trial: optuna.Trial) -> float:
        give_back_if_surplus(study, trial, n_trials)
        params = suggest(trial, space)
        # A trial that continues one stopped early (Ctrl-C, or its worker died) has its folder and last.ckpt.
        earlier = trial.user_attrs.get("folder")
        folder = Path(earlier) if earlier else study_dir / "trials" / f"trial_{trial.number}"
        if earlier is None:
            if folder.exists():
                raise UserError(
                    f"{folder} exists already, from another study of this name: delete {study_dir}"
                )
            trial.set_user_attr("folder", str(folder))
        else:
            trial.set_user_attr(INTERRUPTED_ATTR, False)
        callback = {  # the trial's number comes through the environment: a continued trial's config is the same
            "class_path": "project.studies.trial_pruning.TrialPruning",
            "init_args": {"study_name": study_name, "monitor": space.metric}
            | {"pruner": pruner, "startup_trials": pruner_startup_trials, "warmup": pruner_warmup},
        }
        args = [*fit_args, *as_flags(params), f"--trainer.callbacks+={json.dumps(callback)}"]
        env = {STORAGE_ENV: url, TRIAL_ENV: str(trial.number)} | wandb_env(
            f"tune-{study_name}", f"{study_name}-trial_{trial.number}", "tune-trial"
        )
        resume = earlier is not None and any(folder.rglob("*.ckpt"))
        hint = f"rerun the same tune command to continue: the trial resumes from its last.ckpt in {folder}"
        what = f"trial {trial.number}" + (f" (continuing {Path(earlier).name})" if earlier else "")
        try:
            run_fit(args, folder, what, env, resume=resume, continue_hint=hint)
        except Interrupted:
            interrupted(study, trial)
            raise
        except FitFailed:
            missing = trial_result(study, trial.number).user_attrs.get(METRIC_MISSING_ATTR)
            if missing:  # every trial would fail alike: stop the study now
                raise UserError(
                    f"search file {space.source}: {missing}: set its metric to one of them"
                ) from None
            raise
        done = trial_result(study, trial.number)
        if PRUNED_ATTR in done.user_attrs:
            raise optuna.TrialPruned(f"after {done.user_attrs[PRUNED_ATTR]} validation(s)")
        if done.last_step is None:
            raise FitFailed(f"trial {trial.number}'s fit reported no {space.metric}")
        return done.intermediate_values[done.last_step]

    optuna_log = logging.getLogger("optuna.study._optimize")
    optuna_log.addFilter(_optuna_says_one_line)
    stop = StopAfterFailures(max_failures)
    thread_hook = threading.excepthook
    threading.excepthook = _database_errors_said_once(thread_hook)
    try:
        with lost(url, f"the study {study_name}"):
            # n_trials counts over every worker of the study: one starts a trial only while fewer are taken,
            # and gives back one that two workers asked for at the same moment.
            while not stop.stopped and trials_taken(study) < n_trials:
                try:
                    study.optimize(objective, n_trials=1, catch=(FitFailed,), callbacks=[stop])
                except Surplus:
                    break
            return write_study(study, space, parser, fit_args, study_dir, wandb, wandb_project)
    finally:
        optuna_log.removeFilter(_optuna_says_one_line)
        threading.excepthook = thread_hook


def write_study(
    study: optuna.Study,
    space: SearchSpace,
    parser: Any,
    fit_args: list[str],
    study_dir: Path,
    wandb: bool,
    wandb_project: str,
) -> dict[str, Any]:
    """The trials table (`trials.md`, `trials.json`) and the best trial's complete config (`best_config.yaml`),
    from the storage's state, under a lock: workers sharing the folder write them one at a time, each whole, so
    the last writer leaves the complete table."""
    study_dir.mkdir(parents=True, exist_ok=True)
    with open(study_dir / ".results.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _write_study(study, space, parser, fit_args, study_dir, wandb, wandb_project)


def _write_study(
    study: optuna.Study,
    space: SearchSpace,
    parser: Any,
    fit_args: list[str],
    study_dir: Path,
    wandb: bool,
    wandb_project: str,
) -> dict[str, Any]:
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
    try:
        tune(**parse_args(args))
    except KeyboardInterrupt:  # outside a trial's fit (which says what continues it): nothing to save
        print("error: stopped by Ctrl-C; rerun the same command to continue the study", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
