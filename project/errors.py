"""The one exception type for bad user input (a missing folder, a corrupt image, a wrong value).

The CLI prints it as a single `error: ...` line and exits non-zero, without a traceback: the message
itself must name what is at fault (the file, key or value) and what to do about it.
"""


class UserError(Exception):
    """Bad input from the user, reported as one clear line."""
