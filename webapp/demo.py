"""``senddock demo``: everything embedded, seeded, ready to watch.

Embedded PostgreSQL, a local SMTP sink scripted to soft-fail and hard-bounce a few hundred
addresses, a 10,000-subscriber list, a draft campaign ready to send, a small campaign
already draining, and the dashboard on http://127.0.0.1:5000.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa
from sqlalchemy.engine import Connection

DEMO_USERS = {"admin@example.com": "admin", "marketer@example.com": "marketer",
              "support@example.com": "support"}

SINK_RULES = {"rules": [
    {"match": "bounce-*@example.net", "reply": "550 5.1.1 The email account does not exist"},
    {"match": "full-*@example.net", "reply": "452 4.2.2 Mailbox full", "times": 2},
    {"match": "later-*@example.net", "reply": "451 4.3.0 Temporary local problem", "times": 1},
    {"match": "spam-*@example.net", "reply": "550 5.7.1 Message rejected as spam by policy"},
]}

NEWSLETTER_HTML = """<h1>Hello {{ name or "there" }}!</h1>
<p>This is the November newsletter of <strong>SendDock</strong>.</p>
<p>Your plan: {{ attributes.plan | default("free") }}.</p>
<p><a href="{{ unsubscribe_url }}">Unsubscribe</a></p>"""

NEWSLETTER_TEXT = """Hello {{ name or "there" }}!

This is the November newsletter of SendDock.
Your plan: {{ attributes.plan | default("free") }}.

Unsubscribe: {{ unsubscribe_url }}"""


def seed(conn: Connection, subscribers: int, password: str) -> dict[str, int]:
    """Users, a list of ``subscribers`` addresses (some scripted to fail in the sink), a
    draft campaign and a small campaign. Idempotent: does nothing if already seeded."""
    from webapp.domain import campaigns, users

    if conn.execute(sa.text("SELECT 1 FROM lists WHERE name = 'Demo subscribers'")).first():
        return {}
    for email, role in DEMO_USERS.items():
        if users.find_user(conn, email) is None:
            users.create_user(conn, email, password, role, actor="demo")
    main_list = conn.execute(sa.text(
        "INSERT INTO lists (name, description) VALUES ('Demo subscribers', "
        "'Seeded by senddock demo') RETURNING id")).scalar_one()
    small_list = conn.execute(sa.text(
        "INSERT INTO lists (name, description) VALUES ('Early adopters', "
        "'The first 500 demo subscribers') RETURNING id")).scalar_one()
    # Every 40th address is scripted in the sink: bounce, mailbox full, try later, spam.
    conn.execute(sa.text("""
        INSERT INTO subscribers (email, name, attributes)
        SELECT CASE WHEN g % 160 = 0 THEN 'bounce-' || g || '@example.net'
                    WHEN g % 160 = 40 THEN 'full-' || g || '@example.net'
                    WHEN g % 160 = 80 THEN 'later-' || g || '@example.net'
                    WHEN g % 160 = 120 THEN 'spam-' || g || '@example.net'
                    ELSE 'reader' || g || '@example.com' END,
               'Reader ' || g,
               jsonb_build_object('plan', (ARRAY['free', 'pro', 'team'])[1 + g % 3])
          FROM generate_series(1, :n) g
        ON CONFLICT DO NOTHING"""), {"n": subscribers})
    conn.execute(sa.text("""
        INSERT INTO memberships (list_id, subscriber_id) SELECT :l, id FROM subscribers
        ON CONFLICT DO NOTHING"""), {"l": main_list})
    conn.execute(sa.text("""
        INSERT INTO memberships (list_id, subscriber_id)
        SELECT :l, id FROM subscribers ORDER BY id LIMIT 500 ON CONFLICT DO NOTHING"""),
        {"l": small_list})
    common = {"text": NEWSLETTER_TEXT, "html": NEWSLETTER_HTML}
    draft = campaigns.create(conn, {"name": "November newsletter", "list_id": main_list,
                                    "subject": "What's new in November, {{ name }}",
                                    **common}, default_from="news@example.com", actor="demo")
    warmup = campaigns.create(conn, {"name": "Early adopters welcome", "list_id": small_list,
                                     "subject": "Welcome aboard, {{ name }}", **common},
                              default_from="news@example.com", actor="demo")
    campaigns.send(conn, warmup["id"], actor="demo")
    return {"list": main_list, "draft": draft["id"], "sending": warmup["id"]}


# The sink keeps the newest messages whole for the mail viewer (/demo/mail): a folder under
# the data dir survives restarts and is shared by the sink process and the dashboard;
# 1,000 messages of a few kB each bound it to a few MB however much the demo sends.
DEMO_MAIL_KEEP = 1000


def mail_dir(data_dir: Path) -> Path:
    """Where the demo's sink keeps the messages it received."""
    return data_dir / "demo-mail"


def _start_sink(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    rules = data_dir / "demo-sink-rules.json"
    rules.write_text(json.dumps(SINK_RULES, indent=2))
    record = data_dir / "demo-sink.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "webapp", "smtp-sink", "--port", str(port), "--rules",
         str(rules), "--record", str(record), "--quiet", "--keep", str(mail_dir(data_dir)),
         "--keep-last", str(DEMO_MAIL_KEEP)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if "listening" in line:
            return proc
        if proc.poll() is not None:
            break
    proc.kill()
    raise click.ClickException(f"the demo SMTP sink could not start on port {port} "
                               "(is the port in use?)")


@click.command()
@click.option("--port", default=5000, type=int, help="Dashboard port.")
@click.option("--smtp-port", default=2525, type=int, help="Port of the embedded SMTP sink.")
@click.option("--subscribers", default=10_000, type=int, help="Size of the seeded list.")
def demo(port: int, smtp_port: int, subscribers: int) -> None:
    """Run everything embedded: PostgreSQL, an SMTP sink, seeded data, the dashboard."""
    from webapp.runtime import delivery_engine, load_config, open_engine, serve_app
    from workers.after_acceptance.pool import worker_pool

    data_dir = Path(os.environ.get("SENDDOCK_DATA_DIR", "./.senddock")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SENDDOCK_DATA_DIR", str(data_dir))
    os.environ.setdefault("SENDDOCK_SMTP_URL", f"smtp://127.0.0.1:{smtp_port}?tls=none")
    os.environ.setdefault("SENDDOCK_BASE_URL", f"http://127.0.0.1:{port}")
    os.environ.setdefault("SENDDOCK_FROM", "SendDock Demo <news@example.com>")
    secret_file = data_dir / "secret_key"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_urlsafe(48))
    os.environ.setdefault("SENDDOCK_SECRET_KEY", secret_file.read_text().strip())
    password_file = data_dir / "demo_password"
    if not password_file.exists():
        password_file.write_text(secrets.token_urlsafe(9))
    password = password_file.read_text().strip()

    config = load_config()
    config.extra["process"] = "demo"
    config.extra["demo_mail_dir"] = str(mail_dir(data_dir))
    config.extra["demo_mail_keep"] = DEMO_MAIL_KEEP
    click.echo("Starting embedded PostgreSQL (first run takes a few seconds)...", err=True)
    engine = open_engine(config, process="demo")
    sink = _start_sink(data_dir, smtp_port)
    try:
        with engine.begin() as conn:
            seed(conn, subscribers, password)
        from webapp import create_app

        app = create_app(config, engine=engine)
        pool = worker_pool(delivery_engine(engine, config, "demo"), config)
        app.extensions["senddock"].pool = pool
        pool.start()
        click.echo("\n".join([
            "",
            f"  SendDock demo: http://127.0.0.1:{port}",
            "",
            *(f"  {role:<9} {email}  password: {password}" for email, role in DEMO_USERS.items()),
            "",
            f"  SMTP sink on 127.0.0.1:{smtp_port}, recording to {data_dir / 'demo-sink.jsonl'}",
            f"  Open what it received (as the admin): http://127.0.0.1:{port}/demo/mail",
            f"  A small campaign is already sending. 'November newsletter' ({subscribers:,}",
            "  recipients, a few hundred scripted to bounce, fail or retry) is a draft:",
            "    1. log in (as the marketer or the admin) and open Campaigns",
            "    2. open 'November newsletter', preview it, send yourself a test",
            "    3. click 'Review and send…', send it, and watch the counters drain live",
            "  Press Ctrl+C to stop.",
            "",
        ]))
        serve_app(app, "127.0.0.1", port, 8, pool)
    finally:
        sink.terminate()
        sink.wait(10)
        _stop_database(engine, config, data_dir)


def _stop_database(engine: Any, config: Any, data_dir: Path) -> None:
    """The demo's own PostgreSQL stops with it (one configured by URL is left alone)."""
    if config.database_url:
        return
    engine.dispose()
    from webapp import pgserver

    pgdata = data_dir / "pgdata"
    if pgserver.stop_embedded(data_dir):
        click.echo(f"Stopped the demo's PostgreSQL ({pgdata}); its data stays there for "
                   "the next `senddock demo`.", err=True)
    else:
        click.echo("The demo's PostgreSQL is still running (another process uses it). "
                   f"Stop it with: pg_ctl -D {pgdata} stop", err=True)
