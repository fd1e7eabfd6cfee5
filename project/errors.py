"""The one exception type for bad user input (a missing folder, a corrupt image, a wrong value).

The CLI prints it as a single `error: ...` line and exits non-zero, without a traceback: the message
itself must name what is at fault (the file, key or value) and what to do about it.
"""


class UserError(Exception):
    """Bad input from the user, reported as one clear line."""


def find_user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind `exc`, if any: jsonargparse and DataLoader workers wrap the errors they catch."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
