"""`python -m project`: the commands fit/validate/test/predict (project.cli.commands) and the tool commands.

`main` runs the command a command line names and turns what stops it into one line and an exit code: a bad
setting (`error: ...`, 1; a parse error, 2), Lightning refusing a setting (1), a stop on SIGTERM or Ctrl-C after
which the run continues with `--ckpt_path last` (143 or 130). Each command is one function that reads top to
bottom (`fit`: parse, plan, build the data, the task and the callbacks, build a Trainer, fit, test, report);
scripts, notebooks and tests call the same functions.
"""

import importlib
import signal
import sys

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException

# Importing these makes their short class names (`class_path: SimpleCNN`) resolvable in configs.
import project.callbacks  # noqa: F401
import project.models  # noqa: F401
from project import SUBCOMMANDS, TOOLS, USAGE, print_commands
from project.callbacks import interrupts
from project.cli.commands import COMMANDS, Run, build, fit, fit_summary, predict, run_command, test, validate
from project.cli.config import SEED, fit_parser, parse_fit_args
from project.cli.lightning_notices import quiet_lightning_notices
from project.cli.tool_args import split_args
from project.errors import find_user_error
from project.loggers.wandb import finish_runs
from project.run.run_folder import release_run_folders
from project.run.startup import resume_garbage_collection

__all__ = [
    "SEED",
    "Run",
    "build",
    "fit",
    "fit_parser",
    "fit_summary",
    "main",
    "parse_fit_args",
    "predict",
    "run_command",
    "split_args",
    "test",
    "validate",
]


def main(args: list[str] | None = None) -> None:
    """Entry point of `python -m project`."""
    argv = sys.argv[1:] if args is None else [str(a) for a in args]
    quiet_lightning_notices()
    try:
        if argv and argv[0] in TOOLS:
            resume_garbage_collection()  # (paused only for the commands; a tool may run for hours)
            module, function = TOOLS[argv[0]][0].split(":")
            getattr(importlib.import_module(module), function)(argv[1:])
            return
        if not argv or argv[0] in ("-h", "--help"):
            print_commands()
            return
        if argv[0].startswith("-"):
            print(f"error: the command comes first ({USAGE} fit --config ...); the commands are "
                  f"{', '.join([*SUBCOMMANDS, *TOOLS])}", file=sys.stderr)  # fmt: skip
            sys.exit(2)
        if argv[0] not in SUBCOMMANDS:
            print(
                f"error: unknown command {argv[0]!r}; the commands are {', '.join([*SUBCOMMANDS, *TOOLS])}",
                file=sys.stderr,
            )
            sys.exit(2)
        COMMANDS[argv[0]](argv[1:])
        finish_runs(0)
    except SIGTERMException:  # preemption or Ctrl-C: stopped after a batch; BestAndLastCheckpoint saved it
        code = 128 + (signal.SIGINT if interrupts.stopped_by.startswith("Ctrl-C") else signal.SIGTERM)
        finish_runs(code)
        hint = (
            interrupts.resume_hint()
        )  # None in a fold or trial: cv or tune names the command that continues
        if hint:
            # One write of the whole line: every process of a run says it, and print's two writes (the text,
            # then the newline) on an unbuffered stderr let the processes' lines run into each other.
            sys.stderr.write(f"error: stopped by {interrupts.stopped_by}; {hint}\n")
        sys.exit(code)
    except MisconfigurationException as exc:  # Lightning's word for settings it refuses: each names its key
        finish_runs(1)
        print(f"error: trainer: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        user_error = find_user_error(exc)
        if user_error is None:
            raise
        finish_runs(1)
        if not user_error.already_said:
            print(f"error: {user_error}", file=sys.stderr)
        sys.exit(1)
    finally:
        release_run_folders()
