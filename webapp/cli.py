"""The ``senddock`` command (docs/design.md §24)."""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from webapp import db
from webapp.runtime import (
    database_url,
    delivery_engine,
    load_config,
    open_engine,
    serve_app,
    wait_for_database,
)
from workers.core.settings import markdown_table, with_table


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
    wait_for_database(database_url(config), "migrate")
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
@click.option("--default-kind", default=None,
              help="Kind of mail the token submits by SMTP when no X-SendDock-Kind says.")
@click.option("--scope", "scopes", multiple=True,
              help="A scope (send, read_jobs, campaigns, admin), repeatable; default: every "
                   "scope the user's role may hold.")
def token_create(email: str, name: str, default_kind: str | None,
                 scopes: tuple[str, ...]) -> None:
    """Create an API token; prints the token alone on stdout (shown once)."""
    from webapp.domain import users
    from webapp.domain.errors import Invalid

    config = load_config()
    engine = open_engine(config)
    with engine.begin() as conn:
        user = users.find_user(conn, email)
        if user is None:
            raise click.ClickException(f"no user with email {email}")
        try:
            token = users.create_token(conn, user["id"], name, actor="cli",
                                       scopes=list(scopes) or None)
        except Invalid as exc:
            raise click.ClickException(str(exc.message)) from exc
        if default_kind is not None:
            from webapp.domain import submissions

            token_id = users.user_for_token(conn, token)["token_id"]  # type: ignore[index]
            submissions.set_default_kind(conn, token_id, default_kind)
    click.echo(token)


@main.group("webhook-token")
def webhook_token_group() -> None:
    """Manage bearer tokens for POST /webhooks/generic."""


@webhook_token_group.command("create")
@click.option("--name", default="", help="A label to recognise the token by (the source).")
def webhook_token_create(name: str) -> None:
    """Create a webhook token; prints the token alone on stdout (shown once)."""
    from webapp.domain import feedback_intake

    engine = open_engine(load_config())
    with engine.begin() as conn:
        token = feedback_intake.create_webhook_token(conn, name, actor="cli")
    click.echo(token)


@webhook_token_group.command("revoke")
@click.argument("prefix")
def webhook_token_revoke(prefix: str) -> None:
    """Revoke the webhook token that starts with PREFIX (its first 10 characters)."""
    from webapp.domain import feedback_intake

    engine = open_engine(load_config())
    with engine.begin() as conn:
        n = feedback_intake.revoke_webhook_token(conn, prefix[:10], actor="cli")
    if not n:
        raise click.ClickException(f"no live webhook token starts with {prefix[:10]}")
    click.echo(f"revoked {n} token(s)")


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=None, type=int,
              help="request threads (default: SENDDOCK_DB_WEB_POOL, one connection each)")
def serve(host: str, port: int, threads: int | None) -> None:
    """UI + API + worker pool in one process."""
    from webapp import create_app
    from workers.after_acceptance.pool import worker_pool

    config = load_config(require_secret=True)
    config.extra["process"] = "serve"
    engine = open_engine(config, process="serve")
    logging.getLogger("senddock").info("%s", db.budget(config).line("serve"))
    app = create_app(config, engine=engine)
    pool = worker_pool(delivery_engine(engine, config, "serve"), config)
    app.extensions["senddock"].pool = pool
    if config.workers:
        pool.start()
    from webapp.submission import SubmissionServer, SubmissionSettings

    submission = SubmissionSettings.load(config)
    smtp_server = SubmissionServer(engine, config, submission).start() \
        if submission.enabled else None
    try:
        serve_app(app, host, port, threads or config.db_web_pool, pool)
    finally:
        if smtp_server is not None:
            smtp_server.stop()


@main.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", default=5000, type=int)
@click.option("--threads", default=None, type=int,
              help="request threads (default: SENDDOCK_DB_WEB_POOL, one connection each)")
def web(host: str, port: int, threads: int | None) -> None:
    """UI + API only (no delivery), for scale-out."""
    from webapp import create_app

    config = load_config(require_secret=True)
    config.extra["process"] = "web"
    engine = open_engine(config, process="web")
    logging.getLogger("senddock").info("%s", db.budget(config).line("web"))
    serve_app(create_app(config, engine=engine), host, port, threads or config.db_web_pool)


@main.command()
def worker() -> None:
    """The delivery pool only; drains the queue until SIGTERM."""
    from workers.after_acceptance.pool import worker_pool

    config = load_config(require_secret=True)
    config.extra["process"] = "worker"
    web_side = open_engine(config, process="worker")
    engine = delivery_engine(web_side, config, "worker")
    web_side.dispose()
    logging.getLogger("senddock").info("%s", db.budget(config).line("worker"))
    pool = worker_pool(engine, config)

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


@main.command("smtp")
def smtp_command() -> None:
    """The SMTP submission server only (docs/smtp.md), until SIGTERM."""
    from webapp.submission import SubmissionServer, SubmissionSettings

    config = load_config(require_secret=True)
    config.extra["process"] = "smtp"
    submission = SubmissionSettings.load(config)
    if not submission.enabled:
        raise click.ClickException("set SENDDOCK_SUBMISSION_LISTEN and/or "
                                   "SENDDOCK_SUBMISSION_TLS_LISTEN (docs/smtp.md)")
    engine = open_engine(config, process="smtp")
    server = SubmissionServer(engine, config, submission).start()
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    click.echo(f"smtp submission listening {server.ports}", err=True)
    while not stop_requested.wait(0.5):
        pass
    server.stop()


@main.group("dkim")
def dkim_group() -> None:
    """DKIM keys of the sending domains (docs/design.md §19)."""


def _print_key(key: Any) -> None:
    click.echo(f"{key.domain} selector {key.selector} ({key.algorithm}, {key.status})", err=True)
    click.echo(f"publish this TXT record at {key.record_name}:", err=True)
    click.echo(key.zone_line)


@dkim_group.command("create")
@click.argument("domain")
@click.option("--selector", default=None,
              help="The selector (default: the free one of the rotation pair, sd1/sd2).")
@click.option("--algorithm", type=click.Choice(["rsa", "ed25519"]), default="rsa",
              show_default=True, help="rsa: RSA-2048, verified everywhere; ed25519: small, "
                                      "not verified by Gmail yet (add it beside an RSA key).")
def dkim_create(domain: str, selector: str | None, algorithm: str) -> None:
    """Generate a key for DOMAIN and print the DNS record to publish. The first key of an
    algorithm signs at once; a second one is "next" until `senddock dkim activate`."""
    from workers.building import dkim

    config = load_config(require_secret=True)
    engine = open_engine(config)
    try:
        with engine.begin() as conn:
            key = dkim.create_key(conn, config.secret_key, domain, selector=selector,
                                  algorithm=algorithm)
    except dkim.DkimError as exc:
        raise click.ClickException(str(exc)) from None
    _print_key(key)


@dkim_group.command("activate")
@click.argument("domain")
@click.argument("selector")
def dkim_activate(domain: str, selector: str) -> None:
    """Sign DOMAIN's mail with SELECTOR's key from now on (the old key is retired)."""
    from workers.building import dkim

    config = load_config(require_secret=True)
    engine = open_engine(config)
    try:
        with engine.begin() as conn:
            key = dkim.activate_key(conn, domain, selector)
    except dkim.DkimError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{key.record_name} now signs {key.domain}'s mail", err=True)


@dkim_group.command("list")
def dkim_list() -> None:
    """Every key with its status and DNS record."""
    from workers.building import dkim

    config = load_config()
    engine = open_engine(config)
    with engine.connect() as conn:
        for key in dkim.list_keys(conn):
            click.echo(f"{key.status:<8} {key.algorithm:<8} {key.zone_line}")


@main.command("check")
def check() -> None:
    """Is this installation ready to send? Database, migrations, relay (EHLO, STARTTLS,
    AUTH, MAIL FROM), DKIM keys and DNS records, bounce address: one line per check, exit
    status 1 when any is a problem."""
    from webapp.checks import format_line, run_checks

    config = load_config()
    results = run_checks(config)
    for result in results:
        click.echo(format_line(result))
    problems = [r for r in results if r.status == "problem"]
    click.echo(f"\n{len(problems)} problem(s), "
               f"{sum(r.status == 'warning' for r in results)} warning(s)", err=True)
    if problems:
        sys.exit(1)


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
