"""The ``senddock`` command (SPEC 7)."""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from webapp import db
from webapp.runtime import delivery_engine, load_config, open_engine, serve_app
from workers.settings import markdown_table, with_table


class LazyCommand(click.Command):
    """A command whose module is imported only when it runs (or its help is shown)."""

    def __init__(self, name: str, target: str, short_help: str) -> None:
        super().__init__(name, short_help=short_help, help=short_help)
        self._target = target
        self._real: click.Command | None = None

    def _load(self) -> click.Command:
        if self._real is None:
            module_name, attr = self._target.split(":")
            module = importlib.import_module(module_name)
            self._real = getattr(module, attr)
        return self._real

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        return self._load().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        return self._load().invoke(ctx)


@click.group()
def main() -> None:
    """SendDock: self-hosted email sending that never loses track of a message."""


@main.group("db")
def db_group() -> None:
    """Database commands."""


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Apply the migrations (also done by serve, web, worker and demo at start)."""
    config = load_config()
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

    config = load_config()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    engine = open_engine(config)
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

    config = load_config()
    engine = open_engine(config)
    with engine.begin() as conn:
        user = users.find_user(conn, email)
        if user is None:
            raise click.ClickException(f"no user with email {email}")
        token = users.create_token(conn, user["id"], name, actor="cli")
    click.echo(token)


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=8, type=int)
def serve(host: str, port: int, threads: int) -> None:
    """UI + API + worker pool in one process."""
    from webapp import create_app
    from workers.pool import Pool

    config = load_config(require_secret=True)
    engine = open_engine(config)
    app = create_app(config, engine=engine)
    pool = Pool(delivery_engine(engine, config), config)
    app.extensions["senddock"].pool = pool
    if config.workers:
        pool.start()
    serve_app(app, host, port, threads, pool)


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=8, type=int)
def web(host: str, port: int, threads: int) -> None:
    """UI + API only (no delivery), for scale-out."""
    from webapp import create_app

    config = load_config(require_secret=True)
    engine = open_engine(config)
    serve_app(create_app(config, engine=engine), host, port, threads)


@main.command()
def worker() -> None:
    """The delivery pool only; drains the queue until SIGTERM."""
    from workers.pool import Pool

    config = load_config(require_secret=True)
    engine = open_engine(config, pre_ping=False)
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
@click.option("--write", "write_to", type=click.Path(dir_okay=False, exists=True),
              help="Rewrite the generated settings table in this Markdown file "
                   "(docs/configuration.md) instead of printing it.")
def show_config(write_to: str | None) -> None:
    """Print every SENDDOCK_* setting as a Markdown table."""
    if write_to is None:
        click.echo(markdown_table())
        return
    path = Path(write_to)
    path.write_text(with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
    click.echo(f"updated {path}", err=True)


# The demo and the SMTP sink are tools for trying SendDock out and testing it: their modules
# (and aiosmtpd) are imported only when one of them is run.
main.add_command(LazyCommand("demo", "webapp.demo:demo",
                             "Run everything embedded: PostgreSQL, an SMTP sink, seeded data."))
main.add_command(LazyCommand("smtp-sink", "webapp.sink:smtp_sink_command",
                             "A local SMTP server that records what it gets (tests, demo)."))
