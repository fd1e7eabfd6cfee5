"""Where a run's files go: everything under `trainer.default_root_dir`, so one flag moves a whole run."""

from typing import Any

DEFAULT_ROOT_DIR = "logs"


def logger_configs(trainer_config: Any) -> list[Any]:
    """The logger entries of a trainer config as a list (the config allows one, a list, or a bool)."""
    loggers = trainer_config.logger
    if isinstance(loggers, list):
        return loggers
    return [] if loggers in (None, True, False) else [loggers]


def follow_root_dir(loggers: list[Any], root: str) -> None:
    """Point loggers left at the default folder (`logs`) to `root`, the run's trainer.default_root_dir."""
    for logger in loggers:
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and str(init_args.get("save_dir")) == DEFAULT_ROOT_DIR:
            init_args["save_dir"] = root
