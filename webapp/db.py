"""Database access: one SQLAlchemy engine per process, the embedded PostgreSQL fallback
(started by :mod:`webapp.pgserver`), migrations, and the translation of driver errors into
SendDock's own.

Domain functions take a :class:`sqlalchemy.engine.Connection`; callers decide the
transaction (``with engine.begin() as conn: ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from webapp import pgserver
from workers.core import pg


class DatabaseUnavailable(Exception):
    """PostgreSQL cannot be reached right now. Raise it ``from`` the driver's error: the
    error handler translates that cause (:func:`workers.core.pg.classify`, the one place that
    reads SQLSTATEs) into its own message."""


def normalize_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs and point SQLAlchemy at psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url.split('@')[-1]!r}")


def resolve_url(database_url: str | None, data_dir: Path) -> str:
    """The connection string to use (libpq's, multi-host URLs included): the configured
    one, else the embedded server's. A bad URL raises :class:`workers.core.pg.DatabaseUrlError`
    (a ``ValueError``) whose one line names SENDDOCK_DATABASE_URL."""
    if database_url:
        return pg.conninfo(database_url)
    return pg.conninfo(pgserver.start_embedded(data_dir))


def make_engine(url: str, *, pool_size: int = 10, app_name: str = "senddock",
                pre_ping: bool = True, process: str | None = None, role: str = "web",
                statement_timeout: float | None = None, lock_timeout: float | None = None,
                checkout_timeout: float = 30.0, idle_timeout: float | None = 60.0,
                idle_in_transaction: float | None = None) -> Engine:
    """An engine of at most ``pool_size`` connections (a hard cap: see
    :func:`workers.core.pg.make_engine`), checked before use (``pre_ping``) so a restarted
    PostgreSQL costs a failed request or two, not a process restart. The delivery pool
    turns the check off: it retries database errors itself, and the extra round trip per
    transaction cost about 10 % of its throughput. ``application_name`` is
    ``senddock-<process>/<role>`` (``process`` defaults to ``app_name``'s)."""
    if process is None:
        process = app_name.removeprefix("senddock-").removeprefix("senddock") or "app"
    return pg.make_engine(pg.conninfo(url), process=process, role=role, size=pool_size,
                          pre_ping=pre_ping, statement_timeout=statement_timeout,
                          lock_timeout=lock_timeout, checkout_timeout=checkout_timeout,
                          idle_timeout=idle_timeout, idle_in_transaction=idle_in_transaction)


def budget(config: Any) -> pg.Budget:
    """This configuration's connection budget (docs/scale-out.md has the formula)."""
    return pg.Budget(web=config.db_web_pool, delivery=config.db_delivery_pool)


def web_engine(url: str, config: Any, process: str) -> Engine:
    """The web side's engine: DB_WEB_POOL connections with the request timeouts; a
    request waits for a free connection at most the statement timeout. The pre-ping stays
    for connections that sat idle a second or more (:func:`workers.core.pg.make_engine`):
    without it a connection PostgreSQL dropped while it was down answered the request after
    the restart with a driver error instead of the page (tests/integration/test_faults.py);
    a connection in steady use skips it (one round trip in three of a ``POST /messages``,
    docs/performance.md)."""
    return make_engine(url, pool_size=config.db_web_pool, process=process, role="web",
                       statement_timeout=config.db_statement_timeout or None,
                       lock_timeout=config.db_lock_timeout or None,
                       checkout_timeout=config.db_statement_timeout or 30.0,
                       idle_timeout=config.db_idle_timeout or None)


def delivery_engine(url: str, config: Any, process: str) -> Engine:
    """The delivery pool's engine: DB_DELIVERY_POOL connections less the send guard's
    session (opened apart, :class:`workers.delivery.send_guard.SendGuard`) for the drain
    threads, the finisher, maintenance and the rescuer, plus the one the liveness session
    holds for good.
    No request timeouts (claims and finishes must complete), no pre-ping. A transaction
    left idle for DELIVERY_IDLE_IN_TRANSACTION seconds is ended by the server: a worker
    host that vanished mid-transaction holds no row lock a rescue would wait for."""
    return make_engine(url, pool_size=config.db_delivery_pool, process=process,
                       role="delivery", pre_ping=False,
                       idle_timeout=config.db_idle_timeout or None,
                       idle_in_transaction=DELIVERY_IDLE_IN_TRANSACTION)


DELIVERY_IDLE_IN_TRANSACTION = 30.0


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    from webapp.resources import resource_dir

    cfg = Config()
    cfg.set_main_option("script_location", str(resource_dir("migrations")))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations up to ``revision`` (any libpq URL, multi-host too)."""
    from alembic import command

    engine = make_engine(url, pool_size=1, process="migrate", role="migrations",
                         idle_timeout=None)
    try:
        with engine.connect() as connection:
            # Several processes may start at once: one migrates, the others wait.
            connection.execute(sa.text("SELECT pg_advisory_lock(7361001)"))
            try:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = connection
                command.upgrade(cfg, revision)
                connection.commit()
            finally:
                connection.execute(sa.text("SELECT pg_advisory_unlock(7361001)"))
                connection.commit()
    finally:
        engine.dispose()
