"""What a run may record of its command line and its config: secrets (passwords in URLs, values of settings
named like a secret) replaced by `***`, for run_info.json, config.yaml, hparams.yaml, checkpoints and every W&B
run's metadata and config."""

import contextlib
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

#: A setting named like a secret (its last dotted part): its value never lands in a log.
SECRET_NAME = re.compile(r"(password|passwd|secret|token|credential|(^|_)(pwd|key|apikey))s?$", re.IGNORECASE)
#: The credentials in a URL (`scheme://user:password@host`): the password part.
URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^/\s@]*)@")
REDACTED = "***"
_argv_lock = threading.Lock()


def is_secret_name(flag: str) -> bool:
    """A setting whose value is a secret, by its name (`--db.password`, `--api_key`, `WANDB_API_KEY`)."""
    name = flag.lstrip("-").split("=", 1)[0].rsplit(".", 1)[-1]
    return bool(name) and SECRET_NAME.search(name) is not None


def redact_command(args: Sequence[str]) -> list[str]:
    """A command line as it may be recorded: passwords in URLs and the values of settings named like a secret
    (`--X.password V`, `--api_key=V`) replaced by `***`. Everything a run records of its command line (its
    run_info.json, checkpoints, every W&B run's metadata) goes through here."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, args):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and is_secret_name(arg):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(URL_PASSWORD.sub(lambda m: m["head"] + REDACTED + "@", arg))
    return out


def redact_config(tree: Any) -> Any:
    """A config (nested dicts and lists of plain values) as it may be recorded: the values of keys named like a
    secret, and the passwords in URLs anywhere in it, replaced by `***`; everything else as it was. Both sides
    of a comparison between recorded configs (`--ckpt_path last` matching a run) go through here, so a run
    given the same secret still matches."""
    if isinstance(tree, dict):
        return {
            key: REDACTED if is_secret_name(str(key)) and value not in (None, "") else redact_config(value)
            for key, value in tree.items()
        }
    if isinstance(tree, list | tuple):
        return type(tree)(redact_config(value) for value in tree)
    if isinstance(tree, str):
        return URL_PASSWORD.sub(lambda m: m["head"] + REDACTED + "@", tree)
    return tree


@contextlib.contextmanager
def redacted_argv() -> Iterator[None]:
    """While in this block, `sys.argv` is `redact_command(sys.argv)`: for libraries that record the command
    line themselves (`wandb.init` saves `sys.argv` in the run's metadata, which `wandb sync` uploads)."""
    with _argv_lock:
        real = sys.argv
        sys.argv = redact_command(real)
        try:
            yield
        finally:
            sys.argv = real
