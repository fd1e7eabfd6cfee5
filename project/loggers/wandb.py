"""W&B for the template's runs: a run that starts in the background, and offline logging when online fails.

`WandbLogger` is Lightning's, with `wandb.init` (about a second of imports, then wandb's service process)
moved off the path to the first training step: `start()` begins it in a thread (the `WandbDashboard` callback
calls it after the first training step), the config and `watch` requests logged before are handed over when
the run is up, and everything that needs the run itself waits for it.

Online W&B without a network (or without a login): `wandb.init` in online mode blocks for up to 90 s and then
fails the whole run when the server cannot be reached, and it prompts for an API key (or fails) when none is
configured. Before any logger is created, each online `WandbLogger` in the config is checked: server reachable
and credentials present. If not, the logger is switched to offline mode (checkpoint upload as artifacts, which
needs the server, is turned off), and a notice names the reason and the `wandb sync` command that uploads the
run later.
"""

import os
import secrets
import socket
import string
import sys
import threading
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from lightning.pytorch import loggers
from lightning.pytorch.utilities import rank_zero_only

from project.errors import UserError, warn
from project.lightning_private import drop_wandb_init_argument
from project.redaction import redacted_argv

OFFLINE_MODES = ("offline", "dryrun", "disabled")
_loggers: list["WandbLogger"] = []


class WandbLogger(loggers.WandbLogger):
    """Lightning's `WandbLogger`, whose run starts in a background thread when `start()` is called, or when it is
    first needed.

    Hyperparameters and `watch` requests made before the run is up are handed over once it is; anything else
    that needs the run (metrics, the run id) waits for it.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        prefix: str = "",
        checkpoint_name: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        job_type: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Lightning's `WandbLogger` arguments (`name` ... `checkpoint_name`). `entity`, `group`, `tags`, `notes`,
        `job_type` and every key of `init_kwargs` go to `wandb.init`.

        The signature is spelled out rather than `**kwargs`: resolving Lightning's `**kwargs` into
        `wandb.init`'s arguments imports wandb while the command line is parsed (half a second, every run).
        """
        # The run id is chosen here, so the run's version is known before the run is up.
        id = (
            version or id or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        )
        extra = {"entity": entity, "group": group, "tags": tags, "notes": notes, "job_type": job_type}
        extra = {key: value for key, value in extra.items() if value is not None}
        # Quiet: wandb's own start-up lines and closing history table say nothing the progress bar doesn't.
        # Offline, silent too: its three-line banner gives way to one line of ours saying where the run is.
        settings = {"quiet": True} | ({"silent": True} if logs_offline(offline) else {})
        extra = {**extra, "settings": settings} | (init_kwargs or {})
        super().__init__(
            name=name,
            save_dir=save_dir,
            offline=offline,
            dir=dir,
            id=id,
            anonymous=anonymous,
            project=project,
            log_model=log_model,
            prefix=prefix,
            checkpoint_name=checkpoint_name,
            **extra,
        )
        drop_wandb_init_argument(self, "anonymous")
        self._pending: list[Any] = []
        self._start_error: BaseException | None = None
        self._starter: threading.Thread | None = None
        self._ready = False
        _loggers.append(self)

    def start(self) -> None:
        """Begin `wandb.init` in a background thread (global rank 0; once)."""
        if self._starter is None and not self._ready and rank_zero_only.rank == 0:
            self._starter = threading.Thread(target=self._init_run, name="wandb-init", daemon=True)
            self._starter.start()

    def _init_run(self) -> None:
        try:
            with redacted_argv():  # wandb records the command line in the run's metadata
                run = loggers.WandbLogger.experiment.fget(self)
        except BaseException as e:  # raised where the run is first needed, in the main thread
            self._start_error = e
            return
        if getattr(run, "offline", False):
            where = shown_path(run.sync_dir)
            print(f"W&B run {self.version} logged offline; to upload it: wandb sync {where}")

    def _wait(self) -> None:
        if self._ready:
            return
        self.start()
        if self._starter is not None:
            self._starter.join()
        self._ready = True
        if self._start_error is not None:
            reason = (str(self._start_error).strip().splitlines() or [type(self._start_error).__name__])[-1]
            raise UserError(
                f"W&B could not start run {self.version}: {reason}. To train without W&B, leave its logger out "
                "(`--trainer.logger` with the CSVLogger alone) or set WANDB_MODE=disabled"
            ) from self._start_error
        for call in self._pending:
            call()
        self._pending = []

    @property
    def experiment(self) -> Any:
        # Lightning touches `experiment` during setup only to create it early; until the run is up, a stand-in
        # that waits for it on first real use keeps that from stalling the start.
        if not self._ready:
            return _RunWhenReady(self)
        return super().experiment

    def _when_started(self, call: Any) -> None:
        if self._ready:
            call()
        else:
            self._pending.append(call)

    def log_hyperparams(self, params: Any) -> None:
        self._when_started(lambda: super(WandbLogger, self).log_hyperparams(params))

    def watch(
        self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        self._when_started(lambda: super(WandbLogger, self).watch(model, log, log_freq, log_graph))


class _RunWhenReady:
    """Stands in for a W&B run that is still starting: any attribute waits for the run, then is the run's."""

    def __init__(self, logger: WandbLogger) -> None:
        self._logger = logger

    def __getattr__(self, name: str) -> Any:
        self._logger._wait()
        return getattr(self._logger.experiment, name)


def logs_offline(offline: bool) -> bool:
    """Whether a WandbLogger built with `offline` writes its run to disk only (WANDB_MODE may say so too)."""
    return offline or os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun")


def shown_path(path: str) -> str:
    """`path` as a user reads it: relative to the working directory where it lies under it."""
    absolute = Path(path).resolve()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else str(absolute)


def finish_runs(exit_code: int) -> None:
    """Close the W&B run before the process exits. Lightning's WandbLogger never calls `wandb.finish()` and
    leaves it to wandb's exit hook, which on a loaded machine could end the process before wandb's service had
    written the last rows and the run's exit record (a run directory missing its final epoch)."""
    for logger in _loggers:
        if logger._pending:  # a run that never got to start: it still records its config
            try:
                logger._wait()
            except UserError as e:  # said, and the run's own exit status (a SIGTERM's 143, say) stands
                warn(str(e))
    _loggers.clear()
    wandb = sys.modules.get("wandb")  # imported only if a WandbLogger was used
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)


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


def wandb_mode(init_args: dict[str, Any]) -> dict[str, Any]:
    """The `offline` and `log_model` a configured WandbLogger is built with.

    WANDB_MODE=online switches it online. Online needs the server and a login: without either it logs offline
    instead, with a notice naming the reason and the `wandb sync` command that uploads the run later. Offline,
    checkpoints stay on disk (Lightning refuses `log_model` offline: they cannot be uploaded).
    """
    mode = os.environ.get("WANDB_MODE", "").lower()
    offline = bool(init_args.get("offline")) and mode not in ("online", "run")
    log_model = init_args.get("log_model", False)
    if not offline and mode not in OFFLINE_MODES:  # wandb itself runs offline in those, whatever the config
        url = server_url()
        reason = None if has_credentials(url) else f"no W&B API key for {url} (run `wandb login`)"
        reason = reason or unreachable_reason(url)
        if reason is not None:
            warn(
                f"W&B online logging is not possible: {reason}. Logging offline instead; upload the run later "
                f"with `wandb sync {init_args.get('save_dir') or '.'}/wandb/offline-run-*`."
            )
            return {"offline": True, "log_model": False}
    if offline and log_model:
        warn("W&B is offline: checkpoints are not logged as artifacts (log_model needs online)")
        log_model = False
    return {"offline": offline, "log_model": log_model}
