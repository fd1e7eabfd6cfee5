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

The trials' states and how a stopped one is continued are in project.studies.trial_states; what the study
writes is in project.studies.tune_results.
"""

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import optuna
import yaml

from project.atomic_files import check_writable
from project.errors import UserError
from project.run.run_folder import DEFAULT_ROOT_DIR
from project.studies.runner import (
    SETTINGS_FILE,
    FitFailed,
    Interrupted,
    check_produces_metric,
    claim_folder,
    parse_fit_args,
    run_fit,
    wandb_env,
)
from project.studies.search import as_flags, check_search, load_search, suggest
from project.studies.storage import database_error, lost
from project.studies.trial_pruning import (
    METRIC_MISSING_ATTR,
    PRUNED_ATTR,
    STORAGE_ENV,
    TRIAL_ENV,
    Pruner,
    TrialPruning,
    make_pruner,
)
from project.studies.trial_states import (
    INTERRUPTED_ATTR,
    StopAfterFailures,
    Surplus,
    give_back_if_surplus,
    interrupted,
    open_study,
    trial_result,
    trials_taken,
)
from project.studies.tune_results import write_study


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
            "class_path": f"{TrialPruning.__module__}.{TrialPruning.__qualname__}",
            "init_args": {"study_name": study_name, "monitor": space.metric, "search_file": str(space.source)}
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
            if missing:  # every trial would fail alike: stop the study now (the fit's error line said why)
                stopped = UserError(f"search file {space.source}: {missing}: set its metric to one of them")
                stopped.already_said = True
                raise stopped from None
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


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `tune` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(tune, args, prog="python -m project tune")


def main(args: list[str]) -> None:
    try:
        tune(**parse_args(args))
    except KeyboardInterrupt:  # outside a trial's fit (which says what continues it): nothing to save
        print("error: stopped by Ctrl-C; rerun the same command to continue the study", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
