"""Every use of Lightning's private API in the template, in one place.

Lightning's public API covers almost everything the template does. Where it does not, the private attribute,
method or function is reached from here and nowhere else, and tests/test_lightning_private.py pins the
behaviour each one is relied on for: a Lightning upgrade that changes one fails there, naming what changed,
instead of somewhere deep inside a run.
"""

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.tuner.batch_size_scaling import _reset_dataloaders
from lightning.pytorch.utilities.exceptions import _TunerExitException

# -- ModelCheckpoint: refreshing last.ckpt outside its own schedule -----------------------------------------


def skips_saving(callback: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """ModelCheckpoint's own test: fast_dev_run, sanity check, not fitting, or this step already saved."""
    return callback._should_skip_saving_checkpoint(trainer)


def saves_on_train_epoch_end(callback: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Whether the callback saves at the end of the training epoch (no validation follows it) or after validation."""
    return callback._should_save_on_train_epoch_end(trainer)


def save_last(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Write `last.ckpt` now, with the metrics of this moment (its name may contain them)."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def last_saved_step(callback: ModelCheckpoint) -> int:
    """The global step of the callback's latest save (it skips a second save at the same step)."""
    return callback._last_global_step_saved


def set_last_saved_step(callback: ModelCheckpoint, step: int) -> None:
    callback._last_global_step_saved = step


def ends_epoch(trainer: L.Trainer) -> bool:
    """Whether the training batch just run is the epoch's last (also for a loader without a length)."""
    return trainer.fit_loop.epoch_loop._num_ready_batches_reached()


def stop_after_this_batch(trainer: L.Trainer) -> None:
    """Make Lightning stop after the current training batch as it does on SIGTERM (SIGTERMException, after the
    batch's callbacks), without its SIGTERM handler, which broadcasts from inside the handler. Called on every
    process at the same step, so every process stops there."""
    connector = trainer._signal_connector  # the private state behind the public `trainer.received_sigterm`
    if not hasattr(connector, "received_sigterm"):
        raise RuntimeError(
            "this Lightning version keeps no `received_sigterm`: stop_after_this_batch needs updating"
        )
    connector.received_sigterm = True


def route_sigterm(trainer: L.Trainer, handler: Callable[[int, Any], None]) -> None:
    """Have the SIGTERM handler Lightning installs when a fit starts (before the sanity check) call `handler`
    in place of its own notifier, which broadcasts to the other processes from inside the handler and sets a
    flag that stops only the process it reached: a collective the others are not running at that moment (a
    SIGTERM to one process of a DDP run during the sanity check hung both). Called before Lightning installs it
    (a Callback's `setup`)."""
    connector = trainer._signal_connector
    if not callable(getattr(connector, "_sigterm_notifier_fn", None)):
        raise RuntimeError("this Lightning version has no SIGTERM notifier: route_sigterm needs updating")
    # Lightning looks the notifier up on the connector when it builds its handler.
    connector._sigterm_notifier_fn = handler  # pyright: ignore[reportAttributeAccessIssue]


# -- resuming: the training loader's position -------------------------------------------------------------


def load_pending_train_loader_state(trainer: L.Trainer) -> bool:
    """Hand the checkpoint's training-loader state (the position within the epoch) to the loader, where
    Lightning did not; True when there was one to hand over.

    Lightning hands it over in `FitLoop.setup_data` only when it creates the loader there, after the checkpoint
    is read. A loader created earlier, by `trainer.estimated_stepping_batches` in `configure_optimizers` (how a
    OneCycle schedule learns its length), is never given it: the resumed run would start the epoch's order again.
    Called after the checkpoint is read and before the first batch (`on_train_start`); the iterator is made
    again, as `setup_data` would, so no batch fetched ahead of the state is used."""
    fit_loop = trainer.fit_loop
    states, loader = fit_loop._combined_loader_states_to_load, fit_loop._combined_loader
    if not states or loader is None or fit_loop._data_fetcher is None:
        return False
    loader._load_state_dicts(states)
    fit_loop._combined_loader_states_to_load = []
    iter(fit_loop._data_fetcher)
    return True


# -- tuning -------------------------------------------------------------------------------------------------


def end_fit_cleanly() -> NoReturn:
    """End `fit` right here, cleanly (teardown, status FINISHED, no on_train_end): how Lightning's own Tuner
    ends a tuning-only run."""
    raise _TunerExitException()


def reload_dataloaders(trainer: L.Trainer) -> None:
    """Rebuild the running loop's DataLoaders (after the batch size changed)."""
    _reset_dataloaders(trainer)


# -- CSVLogger: continuing a run's metrics.csv ---------------------------------------------------------------


def restore_csv_rows(logger: CSVLogger, keys: Sequence[str], rows: list[dict[str, Any]]) -> None:
    """Put `rows` back into the logger's metrics.csv writer and write them; later rows are appended after them."""
    writer = logger.experiment
    writer.metrics_keys = sorted(keys)
    writer.metrics = rows
    writer.save()


# -- WandbLogger ------------------------------------------------------------------------------------------------


def drop_wandb_init_argument(logger: WandbLogger, name: str) -> None:
    """Leave `name` out of what the logger passes to `wandb.init` (Lightning always passes `anonymous`, which
    wandb 0.2x answers with a deprecation notice on every run)."""
    logger._wandb_init.pop(name, None)


# -- ModelParallelStrategy -----------------------------------------------------------------------------------


def set_data_parallel_size(strategy: ModelParallelStrategy, size: int) -> None:
    """The data-parallel dimension of the device mesh, once the number of processes is known."""
    strategy._data_parallel_size = size


# -- LightningCLI ---------------------------------------------------------------------------------------------


def give_config_dump(cli: LightningCLI, dumped: dict[str, Any]) -> None:
    """Hand LightningCLI's instantiators the config as plain values, already dumped: what a task built from the
    config saves as its hyperparameters (with its class path, for `load_from_checkpoint`). LightningCLI would
    otherwise dump the config again when the first class is built, validating every class in it anew."""
    cli.config_dump = dumped
