"""`python -m project cv`: k-fold cross-validation, each fold an ordinary `fit` in its own folder.

Folds run one after another as `python -m project fit <your flags> --data.split <KFold: K folds, fold k>` in
`<trainer.default_root_dir>/cv/<name>/fold_<k>/`, each with `--ckpt_path last`: a killed study, rerun with
the same command, skips the folds whose `fold_result.json` exists and resumes the interrupted one from its
`last.ckpt`. A fold's result is its best checkpoint (the run's `checkpoint.monitor`, `val/acc` by default)
evaluated here on its validation fold: `val/acc`, `val/loss` and the accuracy of every class (for a multi-label
task `val/map` and every tag's average precision), from exactly the model that checkpoint holds. Once every fold
is complete, the summary (mean and sample standard deviation over the folds) is written beside them as
`cv_results.md` and `cv_results.json` and logged to W&B.

The study folder records the settings it was started with (`settings.json`). A rerun with other settings may
continue the study only where that leaves every fold trained alike, so the folds stay comparable:

- once a fold has finished (its `fold_result.json` exists), no setting may change: rerun with the recorded
  settings, or delete the study folder to start over;
- before any fold has finished, the new settings replace the recorded ones when the folds that have trained
  already (those with a checkpoint) can continue under them: only the length of training differs and none of
  it is shorter (`trainer.max_epochs`, `max_steps`, `max_time`, as `fit --ckpt_path last` allows). Otherwise
  the error names those fold folders: deleting them trains them anew with the new settings.

Settings that keep a fold from producing its result (no validation, no best checkpoint, no `last.ckpt`) are
refused before the first fold trains. The folds' results, their summary and the report are
project.studies.cv_results.
"""

import json
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from project.atomic_files import atomic_write_text, check_writable
from project.data.label_checks import data_warnings_given
from project.errors import UserError, warn
from project.run.plan import callback_args
from project.run.resume import MAY_CHANGE
from project.run.run_folder import DEFAULT_ROOT_DIR
from project.studies.cv_results import (
    RESULT_FILE,
    fold_result,
    metrics_of,
    report,
    summarize,
    test_ensemble_result,
)
from project.studies.folds import KFold
from project.studies.runner import (
    check_produces_metric,
    claim_folder,
    config_stem,
    folder_lock,
    parse_fit_args,
    read_json,
    run_fit,
    setting_name,
    shown,
    wandb_env,
)
from project.studies.tables import log_table, write_results

#: The recorded settings (flattened) that say how long each fold trains.
LENGTH = tuple(f"fit.{key}" for key in MAY_CHANGE if key.startswith("trainer."))


def fold_numbers(folds: int, folds_to_run: str | None) -> list[int]:
    """The folds to run: all of them, or those listed in `folds_to_run` (`0,2`)."""
    if folds < 2:
        raise UserError(f"--folds must be at least 2, got {folds}")
    if folds_to_run is None:
        return list(range(folds))
    try:
        chosen = sorted({int(k) for k in str(folds_to_run).split(",") if k.strip()})
    except ValueError:
        raise UserError(
            f"--folds_to_run must be fold numbers separated by commas, got {folds_to_run!r}"
        ) from None
    outside = [k for k in chosen if not 0 <= k < folds]
    if outside or not chosen:
        raise UserError(f"--folds_to_run {folds_to_run}: folds are numbered 0 to {folds - 1}")
    return chosen


def _budget(value: Any) -> float:
    """A training length as a number to compare (unset: unlimited; a form not understood: NaN, never longer)."""
    if value is None or value == -1:
        return math.inf
    if isinstance(value, str):  # max_time as DD:HH:MM:SS
        try:
            days, hours, minutes, seconds = map(int, value.split(":"))
        except ValueError:
            return math.nan
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def continues_alike(study_dir: Path) -> Callable[[dict[str, Any], dict[str, Any], list[str]], None]:
    """claim_folder's `accept_change` for a cross-validation: the rule in this module's docstring."""

    def accept(before: dict[str, Any], now: dict[str, Any], changed: list[str]) -> None:
        def differs(key: str) -> str:
            was, has = before.get(key), now.get(key)
            return (
                f"the cross-validation {study_dir} was started with {setting_name(key)}={shown(was)}, this "
                f"command has {shown(has)}"
            )

        folds = sorted(study_dir.glob("fold_*"), key=lambda p: p.name)
        finished = [p.name for p in folds if (p / RESULT_FILE).exists()]
        if finished:
            raise UserError(
                f"{differs(changed[0])}, and {', '.join(finished)} finished with the recorded settings: rerun it "
                f"with them to continue it, or delete {study_dir} to start over with the new ones"
            )
        trained = [p for p in folds if any(p.rglob("*.ckpt"))]
        blocking = [
            k for k in changed if k not in LENGTH or not _budget(now.get(k)) >= _budget(before.get(k))
        ]
        if trained and blocking:
            raise UserError(
                f"{differs(blocking[0])}, and {', '.join(p.name for p in trained)} trained with the recorded "
                f"settings already (no fold has finished): delete {' '.join(map(str, trained))} to train them anew "
                "with the new ones, or rerun with the recorded settings"
            )

    return accept


def cv(
    fit_args: list[str],
    folds: int = 5,
    folds_to_run: str | None = None,
    name: str | None = None,
    test_ensemble: bool = False,
    wandb: bool = True,
    wandb_project: str = "lightning-template",
) -> dict[str, Any] | None:
    """K-fold cross-validation: every fold an ordinary `python -m project fit` in its own folder, then a table.

    Args:
        fit_args: The arguments every fold's `fit` gets (all flags that are not cv's own).
        folds: Number of folds K (at least 2): stratified, seeded by data.seed, over the training images.
        folds_to_run: The folds this command runs, comma-separated (`0,2`), e.g. one per GPU node or SLURM
            array task; default: all. The summary is written by the command that finds every fold complete.
        name: The study's folder, `<trainer.default_root_dir>/cv/<name>/`. Default: the last --config's name.
        test_ensemble: Also evaluate the average of the folds' best models (mean of softmax probabilities) on
            the test split, if the data has one, beside the single folds' mean.
        wandb: Log the summary table to a W&B run (offline unless WANDB_MODE=online) in the folds' group.
        wandb_project: W&B project of that run.
    """
    to_run = fold_numbers(folds, folds_to_run)
    parser, config = parse_fit_args(fit_args)
    if "split" not in config.data.get("init_args", {}):
        raise UserError(f"{config.data.class_path} has no split argument: it cannot be cross-validated")
    _, config = parse_fit_args([*fit_args, *fold_flags(folds, 0)])
    from project.cli.config import build_datamodule, task_class

    task = task_class(config.model.class_path)
    checkpoint = callback_args(config, "checkpoint") or {}
    monitor = checkpoint.get("monitor") or getattr(task, "monitor", "monitored metric")
    check_produces_metric(config, "the cross-validation", monitor, needs_best_checkpoint=True)
    datamodule = build_datamodule(config)
    # The data's checks (class counts, a val folder) run at its first scan, here: before any fold.
    _ = datamodule.class_names
    # Class folders may lack `root/test` (testing then falls back to validation); CIFAR's is the official one.
    has_split = getattr(
        datamodule, "has_split", None
    )  # image-file sources; CIFAR has its official test split
    if test_ensemble and has_split is not None and not has_split("test"):
        warn("--test_ensemble: the data has no test split, so there is no ensemble to evaluate")
        test_ensemble = False
    name = name or config_stem(fit_args, "cv")
    study_dir = Path(config.trainer.default_root_dir or DEFAULT_ROOT_DIR) / "cv" / name
    check_writable(study_dir, "trainer.default_root_dir")
    claim_folder(
        study_dir,
        {"folds": folds, "fit": yaml.safe_load(parser.dump(config))},
        "the cross-validation",
        "--name",
        accept_change=continues_alike(study_dir),
    )
    # The data's warnings were given once, when it was built above: not again by every fold's fit and result.
    with data_warnings_given():
        for k in to_run:
            fold_dir = study_dir / f"fold_{k}"
            if (fold_dir / RESULT_FILE).exists():
                print(f"fold {k}: complete ({fold_dir / RESULT_FILE}), skipped")
                continue
            with folder_lock(fold_dir, f"fold {k}"):
                env = wandb_env(f"cv-{name}", f"{name}-fold_{k}", "cv-fold")
                # A fold with a checkpoint continues its run; a new one starts (`--ckpt_path last` would say so).
                resume = any(fold_dir.rglob("*.ckpt"))
                hint = f"rerun the same cv command to continue: fold {k} resumes from its last.ckpt"
                fit_args_k = [*fit_args, *fold_flags(folds, k)]
                run_fit(fit_args_k, fold_dir, f"fold {k} of {folds}", env, resume=resume, continue_hint=hint)
                result = fold_result(fold_dir, k)
                atomic_write_text(
                    fold_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n"
                )  # last: marks the fold complete
            score = metrics_of([result])[0]
            print(f"fold {k}: {score} {result[score]:.4f}, val/loss {result['val/loss']:.4f}")
    read = [read_json(study_dir / f"fold_{k}" / RESULT_FILE) for k in range(folds)]
    missing = [k for k, r in enumerate(read) if r is None]
    if missing:
        print(
            f"folds {', '.join(map(str, missing))} are not complete yet: the summary is written once they are"
        )
        return None
    results = [r for r in read if r is not None]  # all of them: none is missing
    summary = summarize(results)
    with data_warnings_given():
        ensemble = (
            test_ensemble_result([study_dir / f"fold_{k}" for k in range(folds)]) if test_ensemble else None
        )
    text = report(results, summary, ensemble)
    payload = {"name": name, "folds": results, "summary": summary, "test_ensemble": ensemble}
    write_results(study_dir, "cv_results", text, payload, {})
    print(f"\n{text}\nwritten to {study_dir / 'cv_results.md'} and cv_results.json")
    if wandb:
        score, loss = metrics_of(results)
        rows = [[r["fold"], r[score], r[loss], r["epoch"]] for r in results]
        flat = {f"{k}_{stat}": summary[k][stat] for k in (score, loss) for stat in ("mean", "std")}
        flat |= {k: v for k, v in (ensemble or {}).items() if k.endswith("_ensemble")}
        columns = ["fold", score, loss, "best epoch"]
        run_dir = log_table(
            "cv/folds", columns, rows, flat, study_dir, wandb_project, f"cv-{name}", "cv-summary"
        )
        print(f"W&B run: {run_dir}")
    return payload


def fold_flags(folds: int, fold: int) -> list[str]:
    """The flags that make a fit fold `fold` of `folds`: its data's split, `KFold`."""
    split = {"class_path": KFold.__module__ + ".KFold", "init_args": {"num_folds": folds, "fold": fold}}
    return ["--data.split", json.dumps(split)]


def parse_args(args: list[str]) -> dict:
    """The keyword arguments of `cv` for a command line (checks it without running anything)."""
    from project.cli.tool_args import parse_tool_args

    return parse_tool_args(cv, args, prog="python -m project cv")


def main(args: list[str]) -> None:
    try:
        cv(**parse_args(args))
    except KeyboardInterrupt:  # outside a fold's fit (which says what continues it): nothing to save
        print(
            "error: stopped by Ctrl-C; rerun the same command to continue the cross-validation",
            file=sys.stderr,
        )
        raise SystemExit(128 + signal.SIGINT) from None
