"""Online W&B without a network (or without a login): train anyway, offline, and say how to upload later.

`wandb.init` in online mode blocks for up to 90 s and then fails the whole run when the server cannot be
reached, and it prompts for an API key (or fails) when none is configured. Before any logger is created,
each online `WandbLogger` in the config is checked: server reachable and credentials present. If not, the
logger is switched to offline mode (checkpoint upload as artifacts, which needs the server, is turned off)
and a warning names the reason and the `wandb sync` command that uploads the run later.
"""

import os
import socket
import warnings
from typing import Any
from urllib.parse import urlparse

OFFLINE_MODES = ("offline", "dryrun", "disabled")


def server_url() -> str:
    """The W&B server this process would use (WANDB_BASE_URL, else the installed wandb's default)."""
    if os.environ.get("WANDB_BASE_URL"):
        return os.environ["WANDB_BASE_URL"]
    import wandb

    return str(wandb.Settings().base_url)


def has_credentials(url: str) -> bool:
    """An API key in the environment or in ~/.netrc for `url` (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    try:
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth

        return bool(read_netrc_auth(host=url))
    except Exception:  # an unreadable netrc or another wandb version: let wandb itself decide
        return True


def unreachable_reason(url: str, timeout: float = 5.0) -> str | None:
    """Why `url` cannot be reached (DNS, refused, timeout), or None when a TCP connection opens."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return None
    except OSError as e:
        return f"cannot reach {url} ({e.strerror or type(e).__name__})"


def apply_wandb_mode(loggers: list[Any]) -> None:
    """WANDB_MODE=online switches the configured W&B loggers online; offline, checkpoints stay on disk."""
    for logger in loggers:
        init_args = getattr(logger, "init_args", None)
        if init_args is None or not logger.class_path.endswith("WandbLogger"):
            continue
        if os.environ.get("WANDB_MODE", "").lower() in ("online", "run"):
            init_args["offline"] = False
        if init_args.get("offline") and init_args.get("log_model"):
            # Lightning refuses log_model offline (checkpoints cannot be uploaded): keep them on disk instead.
            warnings.warn(
                "W&B is offline: checkpoints are not logged as artifacts (log_model needs online)",
                stacklevel=2,
            )
            init_args["log_model"] = False


def fall_back_to_offline(loggers: list[Any]) -> None:
    """Switch online WandbLoggers in the (not yet instantiated) logger config to offline when they cannot work."""
    if os.environ.get("WANDB_MODE", "").lower() in OFFLINE_MODES:
        return  # wandb itself runs offline whatever the config says
    online = [
        lg
        for lg in loggers
        if getattr(lg, "init_args", None) is not None
        and str(lg.class_path).endswith("WandbLogger")
        and not lg.init_args.get("offline")
    ]
    if not online:
        return
    url = server_url()
    reason = None if has_credentials(url) else f"no W&B API key for {url} (run `wandb login`)"
    reason = reason or unreachable_reason(url)
    if reason is None:
        return
    save_dir = online[0].init_args.get("save_dir") or "."
    for logger in online:
        logger.init_args["offline"] = True
        logger.init_args["log_model"] = False  # uploads need the server; the checkpoints stay on disk
    warnings.warn(
        f"W&B online logging is not possible: {reason}. Logging offline instead; upload the run later "
        f"with `wandb sync {save_dir}/wandb/offline-run-*`.",
        stacklevel=2,
    )
