"""`fit`, `validate`, `test` and `predict`: each command one function, read top to bottom.

A command parses its config with LightningCLI's parser (project.cli.config), plans the run before anything is
built (project.run.plan: its folder, the checkpoint it continues, the loggers' folders and W&B run), builds the
data, the task and the callbacks from the config with the plan applied, builds a `Trainer` and runs it. `fit`
then tests its best checkpoint where the data has a test split, and ends with one line: the best checkpoint,
its score, the test figure and where the metrics are. `python -m project <command>`, the studies' fits, the
notebooks and the tests all run these functions; `build` gives the pieces alone, for a script to drive.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from project.cli.config import CommandLine, check_linked_settings, parse, task_class
from project.cli.trainer_callbacks import run_callbacks
from project.data import ImageDataModule
from project.errors import UserError, find_user_error, innermost_value_error, warn
from project.run.checkpoints import check_fits, with_atomic_checkpoint_io
from project.run.plan import RunPlan, check_accelerator, plan_run, precision_for_this_machine
from project.run.resume import keep_csv_metrics
from project.run.startup import resume_garbage_collection
from project.tasks.task import check_task_fits_data


@dataclass
class Run:
    """What a command built and did."""

    config: Namespace  # the config as given: what the run saves as its config.yaml
    plan: RunPlan
    datamodule: Any
    model: Any  # the task (a LightningModule)
    trainer: Trainer
    tested: dict[str, float] | None = (
        None  # `fit`'s test of its best checkpoint, where the data has a test split
    )


def fit(args: Sequence[str] = ()) -> Run:
    """`python -m project fit`: train the task the config names on its data, then test the best checkpoint where
    the data has a test split (`--test_after_fit false`: not), and say in one line where it all is.

    Args:
        args: The command line after `fit`: `--config FILE` (repeatable; later files and flags win) and
            `--KEY VALUE` flags, as `python -m project fit --help` lists them.
    """
    command = parse("fit", args)
    plan = plan_for(command)
    built = instantiate(command, plan)
    data, task = built.data, built.model
    trainer_settings = for_this_machine(built.trainer)
    callbacks = run_callbacks(command, built, trainer_settings, plan)
    trainer = Trainer(**trainer_settings, callbacks=callbacks)

    start_running(task, plan)
    if plan.resume is not None:
        continue_the_run(trainer, plan)
    trainer.fit(task, datamodule=data, ckpt_path=plan.ckpt_path, weights_only=built.weights_only)
    if plan.resume is not None and trainer.is_global_zero and trainer.global_step == plan.resume.step:
        warn(nothing_trained(trainer, plan))

    tested = None  # (a fit that ended before its first step, a tuning-only run, has nothing to test)
    if command.config.test_after_fit and trainer.global_step > 0 and has_test_split(data):
        tested = test_best_checkpoint(trainer, task, data)
    if trainer.is_global_zero:
        print(fit_summary(trainer, tested), flush=True)
    return Run(command.config, plan, data, task, trainer, tested)


def validate(args: Sequence[str] = ()) -> Run:
    """`python -m project validate`: one evaluation epoch over the validation split (`--ckpt_path` a checkpoint,
    or `best`/`last` of the newest run started with the same network and data)."""
    return evaluate("validate", args)


def test(args: Sequence[str] = ()) -> Run:
    """`python -m project test`: one evaluation epoch over the test split (the validation split where the data
    has none, said in one line)."""
    return evaluate("test", args)


def predict(args: Sequence[str] = ()) -> Run:
    """`python -m project predict`: the task's prediction for every image of the data's prediction set, written to
    predictions.csv in the run's folder."""
    return evaluate("predict", args)


def evaluate(name: str, args: Sequence[str]) -> Run:
    """`validate`, `test` or `predict` (`name`, the Trainer method it runs) of a command line."""
    command = parse(name, args)
    plan = plan_for(command)
    built = instantiate(command, plan)
    data, task = built.data, built.model
    trainer_settings = for_this_machine(built.trainer)
    callbacks = run_callbacks(command, built, trainer_settings, plan)
    trainer = Trainer(**trainer_settings, callbacks=callbacks)

    start_running(task, plan)
    getattr(trainer, name)(task, datamodule=data, **{key: built[key] for key in command.method_args})
    return Run(command.config, plan, data, task, trainer)


def build(args: Sequence[str] = ()) -> Run:
    """The data, task and Trainer of a config (`--config FILE`, `--KEY VALUE`), built and not run: for a script or
    notebook to drive (`run.trainer.fit(run.model, datamodule=run.datamodule)`). It claims no run folder and
    continues no checkpoint."""
    command = parse(None, args)
    plan = plan_for(command)
    built = instantiate(command, plan)
    trainer_settings = for_this_machine(built.trainer)
    callbacks = run_callbacks(command, built, trainer_settings, plan)
    trainer = Trainer(**trainer_settings, callbacks=callbacks)
    return Run(command.config, plan, built.data, built.model, trainer)


#: The commands, by name.
COMMANDS = {"fit": fit, "validate": validate, "test": test, "predict": predict}


def run_command(args: Sequence[str]) -> Run:
    """`python -m project <command> ...` in this process, without main's error lines: `args[0]` is the command."""
    return COMMANDS[str(args[0])](args[1:])


# -- building ---------------------------------------------------------------------------------------------------
def plan_for(command: CommandLine) -> RunPlan:
    """The run's plan (project.run.plan), decided from the config before anything is built."""
    task = task_class(command.config.model.class_path)  # (it says what the checkpoints are ranked by)
    return plan_run(command.command, command.config, command.dumped, task)


def instantiate(command: CommandLine, plan: RunPlan) -> Namespace:
    """Every class the config names (the data, the task and its network, each default callback, the loggers),
    built from a copy of the config with the plan applied; then checked against one another before any data is
    read."""
    try:
        built = command.parser.instantiate(plan.apply(command.config))
    except ValueError as e:
        # A class's own check of its settings (`label_smoothing must be in [0, 1)`), which jsonargparse wraps in
        # its search through the class types a key may take: the innermost message says it.
        raise find_user_error(e) or UserError(f"{innermost_value_error(e)}") from None
    data, task = built.data, built.model
    check_linked_settings(command.config, data, command.given)  # a linked key set by hand: refused
    check_task_fits_data(task, data)  # the kind of target: before data is read
    # A pretrained network's weights expect inputs normalised as in their training: the data uses its mean/std
    # unless the config sets data.mean/data.std (a checkpoint's own, once loaded, win over both).
    net: Any = getattr(task, "net", None)
    if hasattr(net, "input_stats") and isinstance(data, ImageDataModule):
        data.use_network_stats(net.input_stats())
    return built


def for_this_machine(settings: Namespace) -> dict[str, Any]:
    """The Trainer's arguments of the config, checked and fitted to this machine: a GPU asked for where there is
    none is one line; `16-mixed` on a CPU trains in `32-true`; checkpoints are written atomically."""
    trainer = dict(settings)
    check_accelerator(trainer.get("accelerator"))
    if (accumulate := trainer.get("accumulate_grad_batches", 1)) < 1:
        raise UserError(f"trainer.accumulate_grad_batches must be at least 1, got {accumulate}")
    trainer["precision"] = precision_for_this_machine(trainer.get("precision"))
    trainer["plugins"] = with_atomic_checkpoint_io(trainer.get("plugins"))
    return trainer


# -- running ----------------------------------------------------------------------------------------------------
def start_running(task: Any, plan: RunPlan) -> None:
    """Start-up is over (project.run.startup): the collector runs again. Then a checkpoint that does not fit the
    network is one line with the mismatched keys and shapes, before anything runs (Lightning's own message is a
    wall of keys, after the data is loaded)."""
    resume_garbage_collection()
    if plan.ckpt_shapes is not None:
        from project.run.data_identity import check_checkpoint_file  # (a command from a checkpoint)

        check_checkpoint_file(task, str(plan.ckpt_path), plan.subcommand == "fit")
        check_fits(task, plan.ckpt_shapes, source=f"checkpoint {plan.ckpt_path}")


def continue_the_run(trainer: Trainer, plan: RunPlan) -> None:
    """`--ckpt_path last`: the run goes on in its own folder, its metrics.csv kept up to the checkpoint's step."""
    resume = plan.resume
    if resume is None or not trainer.is_global_zero:
        return
    # Lightning warns about the run's own checkpoint folder being non-empty: expected when continuing it.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger) and Path(logger.log_dir).resolve() == resume.run_dir:
            keep_csv_metrics(logger, before_step=resume.step)


def nothing_trained(trainer: Trainer, plan: RunPlan) -> str:
    """The warning for `--ckpt_path last` of a run that had already reached the end of its training."""
    assert plan.resume is not None
    if 0 <= trainer.max_steps <= trainer.global_step:
        limit = f"--trainer.max_steps ({trainer.max_steps})"
    elif trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch:
        limit = f"--trainer.max_epochs ({trainer.max_epochs})"
    else:
        limit = "--trainer.max_time, --trainer.max_steps or --trainer.max_epochs"
    return (
        f"--ckpt_path last: the run in {plan.resume.run_dir} had already reached the end of its training "
        f"(step {plan.resume.step}); nothing was trained. To train longer, raise {limit}"
    )


def has_test_split(data: Any) -> bool:
    """Whether the data holds images kept apart for testing (its `has_test_split()`; one that does not say has
    none): `fit` scores its best checkpoint on them."""
    return bool(getattr(data, "has_test_split", lambda: False)())


def test_best_checkpoint(trainer: Trainer, task: Any, data: Any) -> dict[str, float] | None:
    """The test split's metrics of the best checkpoint the fit kept (of the weights as trained, when it kept
    none), as lightning-hydra-template's `train()` tests after fitting."""
    checkpoint = trainer.checkpoint_callback
    best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
    results = trainer.test(task, datamodule=data, ckpt_path=best or None, weights_only=True, verbose=False)
    return {key: float(value) for key, value in results[0].items()} if results else None


def fit_summary(trainer: Trainer, tested: dict[str, float] | None = None) -> str:
    """The line a fit ends with: where its best checkpoint is and what it scored, its test figure, and where its
    metrics are."""
    checkpoint = trainer.checkpoint_callback
    best = getattr(checkpoint, "best_model_path", "") if checkpoint is not None else ""
    monitor = getattr(checkpoint, "monitor", None)
    if best:
        score = getattr(checkpoint, "best_model_score", None)
        scored = f" ({monitor} {float(score):.4f})" if score is not None else ""
        line = f"best checkpoint: {best}{scored}"
    else:
        line = "no checkpoint was saved"
    if tested:
        name = f"test/{str(monitor).removeprefix('val/')}" if monitor else None
        shown = {name: tested[name]} if name in tested else tested
        line += "; " + ", ".join(f"{key} {value:.4f}" for key, value in shown.items())
    folders = [logger.log_dir for logger in trainer.loggers if isinstance(logger, CSVLogger)]
    return f"{line}; metrics: {Path(folders[0]) / 'metrics.csv'}" if folders else line
