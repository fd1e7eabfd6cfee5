"""What a `tune` study leaves beside its trials: the trials table (`trials.md`, `trials.json`) and the best
trial's complete config (`best_config.yaml`), written from the storage's state, whole and one worker at a time.
"""

import fcntl
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from project.errors import UserError
from project.studies.runner import parse_fit_args
from project.studies.search import SearchSpace, as_flags
from project.studies.tables import log_table, markdown_table, write_results
from project.studies.trial_states import heartbeat_ages, state_label


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
