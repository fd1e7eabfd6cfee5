"""`TrialPruning`: the callback inside a trial's `fit` that reports to the Optuna study and stops bad trials.

`tune` adds it to each trial's command line (`--trainer.callbacks+=...`) with the study's name, the trial's
number and the pruner's settings; the storage URL comes through the environment (`PROJECT_TUNE_STORAGE`), so
a database password never lands in the run's config.yaml, its W&B config or the process list, and so does the
trial's number (`PROJECT_TUNE_TRIAL`), so a trial that continues a stopped one resumes its run unchanged.
"""

import os
from typing import Any, Literal

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback

from project.errors import UserError

STORAGE_ENV = "PROJECT_TUNE_STORAGE"
#: The trial a fit is, set by `tune` for each: a trial that continues another's run keeps its config unchanged.
TRIAL_ENV = "PROJECT_TUNE_TRIAL"
#: The user attribute a trial's fit sets when the search's metric is not among what it logs (the study stops).
METRIC_MISSING_ATTR = "metric_missing"
#: The user attribute a pruned trial's fit sets: how many validations it ran before it was stopped.
PRUNED_ATTR = "pruned_after_validations"
Pruner = Literal["median", "hyperband", "none"]


def make_pruner(kind: Pruner, startup_trials: int, warmup: int) -> optuna.pruners.BasePruner:
    """Optuna's median or Hyperband pruner (or none): the same settings in the study and in every trial."""
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup)
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup))
    return optuna.pruners.NopPruner()


class TrialPruning(Callback):
    """After every validation, reports `monitor` to the trial (step = validations so far, i.e. epochs), asks
    the study's pruner, and stops the fit when it says so: Lightning's `should_stop`, so the run ends as a
    normal one does (checkpoints written, W&B run finished) and the trial is marked with `PRUNED_ATTR`.
    Under DDP, global rank 0 talks to the study and broadcasts the decision.

    Not optuna-integration's `PyTorchLightningPruningCallback`, although it runs with Lightning 2.6 (checked
    with optuna-integration 5.0): it needs a live `optuna.trial.Trial` object, which a fit started from the
    command line cannot be given, and in a single process it raises `TrialPruned` out of `trainer.fit`, ending
    the process with a traceback and a failing exit status that the waiting `tune` cannot tell from a crash
    (its graceful DDP path is chosen through Lightning's private `_accelerator_connector`).

    Args:
        study_name: The Optuna study.
        trial_number: The trial this fit is; default: the environment variable PROJECT_TUNE_TRIAL.
        monitor: The metric reported and optimised (logged by the model, e.g. `val/acc_best`).
        pruner: `median` (Optuna's MedianPruner), `hyperband` (HyperbandPruner) or `none`.
        startup_trials: Median pruner: no pruning until this many trials have finished.
        warmup: Median pruner: no pruning in a trial's first `warmup` validations; Hyperband: its min_resource.
        storage: The study's storage URL; default: the environment variable PROJECT_TUNE_STORAGE.
        search_file: The search file `monitor` comes from, named in the error when the fit never logs it.
    """

    def __init__(
        self,
        study_name: str,
        trial_number: int | None = None,
        monitor: str = "val/acc_best",
        pruner: Pruner = "median",
        startup_trials: int = 5,
        warmup: int = 0,
        storage: str | None = None,
        search_file: str | None = None,
    ) -> None:
        self.study_name, self.trial_number, self.monitor = study_name, trial_number, monitor
        self.search_file = search_file
        self.pruner = make_pruner(pruner, startup_trials, warmup)
        self.storage = storage
        self._trial: optuna.trial.Trial | None = None
        self._validations = 0

    def _url(self) -> str:
        url = self.storage or os.environ.get(STORAGE_ENV)
        if not url:
            raise UserError(f"TrialPruning needs the study's storage URL: set {STORAGE_ENV} (tune does)")
        return url

    def _connect(self) -> optuna.trial.Trial:
        from project.studies.storage import lost, open_storage

        url = self._url()
        number = self.trial_number if self.trial_number is not None else os.environ.get(TRIAL_ENV)
        if number is None:
            raise UserError(f"TrialPruning needs the trial's number: set {TRIAL_ENV} (tune does)")
        storage = open_storage(url, flag=STORAGE_ENV)
        with lost(url, f"trial {number}", "rerun the tune command to continue the study"):
            study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=self.pruner)
            study_id = storage.get_study_id_from_name(self.study_name)
            return optuna.trial.Trial(
                study, storage.get_trial_id_from_study_id_trial_number(study_id, int(number))
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self._trial is None:
            self._trial = self._connect()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._validations += 1
        prune = False
        if trainer.is_global_zero:
            value = trainer.callback_metrics.get(self.monitor)
            trial = self._trial
            assert trial is not None  # connected by on_fit_start, on this same global-zero process
            from project.studies.storage import lost

            with lost(self._url(), f"trial {trial.number}", "rerun the tune command to continue the study"):
                if value is None:
                    logged = ", ".join(sorted(k for k in trainer.callback_metrics if "/" in k))
                    message = f"the metric {self.monitor} is never logged by the fit (it logs {logged})"
                    trial.set_user_attr(METRIC_MISSING_ATTR, message)
                    where = f"search file {self.search_file}: " if self.search_file else ""
                    raise UserError(f"{where}{message}: set metric in the search file to one of them")
                trial.report(float(value), step=self._validations)
                prune = trial.should_prune()
                if prune:
                    trial.set_user_attr(PRUNED_ATTR, self._validations)
        if trainer.strategy.broadcast(prune):
            trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self._validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._validations = int(state_dict.get("validations", 0))
