"""A study's database: the one place that opens it, and the one way its failures reach the user.

`tune` (and the `TrialPruning` callback inside every trial's fit) open the study's storage here, as an Optuna
`RDBStorage` on a SQLAlchemy URL. What can go wrong with it is the user's to fix, and each is one `error:` line
that names the database by its host (never its password) and says what to do:

- a URL SQLAlchemy cannot read, or a database kind it does not know;
- a driver that is not installed (a bare `postgresql://` means psycopg 3 to SQLAlchemy 2: the `postgres` extra);
- a SQLite file whose folder does not exist;
- a server that cannot be reached, or that goes away while the study runs (`lost`).
"""

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from project.errors import UserError

#: What installs the driver a URL names (`dialect+driver`, or the dialect's default driver).
DRIVER_HINTS = {
    "postgresql": "pip install -e '.[postgres]' (psycopg 3, what a bare postgresql:// URL uses)",
    "postgresql+psycopg": "pip install -e '.[postgres]' (psycopg 3)",
    "postgresql+psycopg2": "pip install psycopg2-binary, or write the URL as postgresql://... and pip install "
    "-e '.[postgres]' (psycopg 3)",
    "mysql": "pip install mysqlclient, or pip install pymysql and write the URL as mysql+pymysql://...",
}


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***` (a URL SQLAlchemy cannot read is hidden after its scheme)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://***" if sep else url if "@" not in url and ":" not in url else "***"


def where(url: str) -> str:
    """The database a URL names, for messages: `host:port/database` or the SQLite file, no credentials."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return redact_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"SQLite file {parsed.database}" if parsed.database else "an in-memory SQLite database"
    host = parsed.host or "localhost"
    return f"{parsed.get_backend_name()} database {parsed.database or ''} on {host}" + (
        f":{parsed.port}" if parsed.port else ""
    )


def check_url(url: str, flag: str = "--storage") -> None:
    """A UserError unless `url` is a SQLAlchemy URL whose driver is installed and, for SQLite, whose folder
    exists: without connecting to anything."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    example = "such as sqlite:///path/study.db or postgresql://user@host/database"
    try:
        parsed = make_url(url)
        backend = parsed.get_backend_name()
        _ = parsed.port  # a port that is not a number is found only when read
    except (ArgumentError, ValueError) as e:
        reason = str(e).splitlines()[0]
        raise UserError(
            f"{flag} {redact_url(url)} is not a database URL ({reason}): write it as "
            f"dialect[+driver]://user:password@host[:port]/database, {example}"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except ArgumentError:
        raise UserError(
            f"{flag} {redact_url(url)}: SQLAlchemy knows no database kind {backend!r}; use one {example}"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        hint = DRIVER_HINTS.get(parsed.drivername) or f"install the Python driver of {parsed.drivername}"
        raise UserError(
            f"{flag} {redact_url(url)}: the database driver is not installed ({e}): {hint}"
        ) from None
    if backend == "sqlite" and parsed.database and parsed.database != ":memory:":
        folder = Path(parsed.database).absolute().parent
        if not folder.is_dir():
            raise UserError(
                f"{flag} {redact_url(url)}: the SQLite file's folder {folder} does not exist: create it, or "
                "choose another path"
            )


def _reason(error: BaseException) -> str:
    """The first line of the database's own words for `error` (SQLAlchemy's wrapper without its SQL and
    its link to the SQLAlchemy docs)."""
    inner = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(inner).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(inner).__name__


def database_error(error: BaseException) -> BaseException | None:
    """The SQLAlchemy or driver error behind `error` (Optuna raises others while cleaning up after it)."""
    from sqlalchemy.exc import SQLAlchemyError

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, SQLAlchemyError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return None


def database_reason(error: BaseException, url: str) -> str | None:
    """The database's own words for the failure behind `error`, with the password of `url` hidden; None when
    no database error is behind it (then it is not ours to explain)."""
    cause = database_error(error)
    return None if cause is None else _reason(cause).replace(_password(url) or "\0", "***")


@contextlib.contextmanager
def lost(
    url: str, what: str = "the study", hint: str = "rerun the same command to continue it"
) -> Iterator[None]:
    """Within this block, a database failure is one UserError naming the database (never its password)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        reason = database_reason(e, url)
        if reason is None:
            raise
        raise UserError(
            f"{what} lost its database, the {where(url)} ({reason}): check that it is running and reachable, "
            f"then {hint}"
        ) from None


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password  # type: ignore[return-value]
    except Exception:
        return None


def open_storage(url: str, flag: str = "--storage", **settings: Any) -> Any:
    """Optuna's `RDBStorage` on `url` (creating its tables on first use), with `settings` (heartbeat and the
    like); every failure to open it is one UserError (see the module docstring)."""
    import warnings

    import optuna

    check_url(url, flag)
    with warnings.catch_warnings():  # the heartbeat and its retry callback are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for attempt in range(TABLE_RACE_RETRIES + 1):
            try:
                return optuna.storages.RDBStorage(url, **settings)
            except Exception as e:
                if attempt < TABLE_RACE_RETRIES and _tables_made_meanwhile(e):
                    # Two processes opening a new database at once both create Optuna's tables, and PostgreSQL
                    # refuses the second CREATE TABLE: by now the first has made them, and they open.
                    time.sleep(0.2 * (attempt + 1))
                    continue
                reason = database_reason(e, url)
                if reason is None:
                    raise
                raise UserError(
                    f"{flag}: cannot open the {where(url)} ({reason}): check that the server is running, "
                    "reachable and accepts this user, and that the database exists"
                ) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


#: Times a storage is opened again after its tables were created by another process at the same moment.
TABLE_RACE_RETRIES = 3


def _tables_made_meanwhile(error: BaseException) -> bool:
    """Whether `error` is a CREATE TABLE that lost to another process's (a duplicate type or relation)."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, IntegrityError | ProgrammingError) and (
            "pg_type_typname_nsp_index" in str(seen) or "already exists" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
