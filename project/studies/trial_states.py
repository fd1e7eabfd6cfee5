"""The states of a `tune` study's trials in its storage, and how a trial stopped early is continued.

A trial counts towards `n_trials` once finished (complete or pruned) or while running; one asked for beyond
that is given back unrun (`Surplus`). A trial stopped by Ctrl-C or SIGTERM is marked INTERRUPTED, and one whose
worker died stops sending Optuna's heartbeat and is failed once the grace period has passed: either way a new
trial continues it with its parameters, folder and reports (`open_study` sets up the heartbeat and the retries).
`state_label` says which, for the trials table; `StopAfterFailures` ends a study whose trials keep failing.
"""

import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from project.studies.search import SearchSpace
from project.studies.storage import lost, open_storage

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
#: The user attribute of a trial stopped by Ctrl-C or SIGTERM (its fit saved last.ckpt; a new trial continues it).
INTERRUPTED_ATTR = "interrupted"


class StopAfterFailures:
    """An Optuna callback that stops the study after `limit` failed trials in a row (a bug, not bad luck)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row, self.stopped = limit, 0, False

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.in_a_row = self.in_a_row + 1 if trial.state == TrialState.FAIL else 0
        if self.in_a_row >= self.limit:
            self.stopped = True
            study.stop()


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
