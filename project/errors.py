"""The one exception type for bad user input (a missing folder, a corrupt image, a wrong value), and the one
way to tell the user something they must see.

The CLI prints a UserError as a single `error: ...` line and exits non-zero, without a traceback: the message
itself must name what is at fault (the file, key or value) and what to do about it. `warn` prints a
`warning: ...` line through logging, so that it shows whatever the Python warning filters say
(`PYTHONWARNINGS=ignore` is common in ML shells, and would hide a `warnings.warn`).
"""

import logging
import sys

from project import PACKAGE


class UserError(Exception):
    """Bad input from the user, reported as one clear line."""

    #: The line was already printed by the process that found it (a study's fit, whose output the user sees):
    #: the command ends with its exit status and does not print it a second time.
    already_said: bool = False

    def __str__(self) -> str:
        # Raised in a DataLoader worker, it is raised again in the main process with the worker's whole
        # traceback as its message ("Caught UserError in DataLoader worker process 0. Original Traceback ...");
        # its last line is the message.
        text = super().__str__()
        if "Original Traceback" in text:
            last = [line for line in text.strip().splitlines() if line.strip()][-1]
            text = last.split(": ", 1)[1] if ": " in last else last
        return text


def find_user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind `exc`, if any: jsonargparse and DataLoader workers wrap the errors they catch."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def innermost_value_error(exc: BaseException) -> BaseException:
    """The ValueError deepest in the chain of `exc` (the one the others were raised from): a class's own check
    of its settings, which jsonargparse wraps in its search through the types a key may take."""
    found, seen, link = exc, set[int](), exc.__cause__ or exc.__context__
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        found = link if isinstance(link, ValueError) else found
        link = link.__cause__ or link.__context__
    return found


class _StderrHandler(logging.StreamHandler):
    """Writes to the current sys.stderr (looked up at each message, so redirections and test captures see it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _warning_log() -> logging.Logger:
    """The package's logger, given its `warning: ...` handler on first use (not at import: importing the package
    leaves the logging set-up of a notebook or script that imports it as it was)."""
    log = logging.getLogger(PACKAGE)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


def warn(message: str) -> None:
    """Tell the user something they must see, on stderr as `warning: ...`, once (global rank 0 only)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only  # the rank Lightning keeps up to date

    rank_zero_only(_warning_log().warning)(message)
