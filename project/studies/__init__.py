"""Studies made of many ordinary `fit` runs: k-fold cross-validation (`cv`) and hyperparameter search (`tune`).

Each run is `python -m project fit` in a subprocess, with the user's configs and flags passed through
unchanged, in its own folder under `trainer.default_root_dir`: every preset and flag of `fit` works inside a
fold or a trial. `runner` holds what both need (argument splitting, the fit subprocess, resumable folders)
and `tables` their result tables; `cv` (with `cv_results`), `tune` (with `trial_states` and `tune_results`),
`search` (search files), `storage` (the study's database) and `trial_pruning` (the callback inside a trial's
fit) build on them. This is a tool layer: it imports the CLI, data, run and io layers, and nothing imports it.
"""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "commands": {
        "cv": (".cv:main", "k-fold cross-validation: one fit per fold, then the table"),
        "tune": (".tune:main", "hyperparameter search with Optuna: one fit per trial"),
    },
    "splits": {"KFold": ".folds"},
}
