"""The demo's mail viewer: the demo's sink keeps each message whole
(bounded), and /demo/mail, only in `senddock demo` and only for admins, shows them as the
recipient would see them, links clickable, content escaped."""

from __future__ import annotations

import re
import smtplib
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from webapp import create_app
from webapp.sink import MailKeeper, SinkServer, kept_ids, kept_raw

CONFIRM = "http://127.0.0.1:5000/subscribe/confirm/abc.def"
TRACKED = "http://127.0.0.1:5000/t/c/xyz?u=1&v=2"


def _mail(to: str, subject: str, html_body: str | None, text: str | None) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "SendDock Demo <news@example.com>"
    message["To"] = to
    message["Subject"] = subject
    message["List-Unsubscribe"] = "<http://127.0.0.1:5000/u/tok>"
    if text is not None:
        message.set_content(text)
    if html_body is not None:
        if text is None:
            message.set_content(html_body, subtype="html")
        else:
            message.add_alternative(html_body, subtype="html")
    return message


def _send(port: int, message: EmailMessage) -> None:
    with smtplib.SMTP("127.0.0.1", port) as smtp:
        smtp.send_message(message)


@pytest.fixture()
def kept(tmp_path: Path) -> Any:
    server = SinkServer(record_path=tmp_path / "kept.jsonl", keep_dir=tmp_path / "mail",
                        keep_last=5)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def demo_app(engine: sa.Engine, config_for: Callable[..., Any], kept: Any) -> Any:
    config = config_for(kept.port)
    config.extra["process"] = "demo"
    config.extra["demo_mail_dir"] = str(kept.keep_dir)
    application = create_app(config, engine=engine)
    application.config["TESTING"] = True
    return application


def test_the_sink_keeps_the_newest_messages_whole_and_only_those(kept: Any,
                                                                 tmp_path: Path) -> None:
    for n in range(7):
        _send(kept.port, _mail(f"r{n}@example.com", f"Message {n}", None, f"body {n}\n"))
    assert len(kept.records()) == 7  # every message is still recorded
    assert kept_ids(kept.keep_dir) == [3, 4, 5, 6, 7]  # only the newest 5 are kept
    assert b"body 6" in (kept_raw(kept.keep_dir, 7) or b"")
    assert kept_raw(kept.keep_dir, 2) is None
    assert sorted(p.name for p in kept.keep_dir.iterdir()) == sorted(
        f"{n:08d}.{ext}" for n in range(3, 8) for ext in ("eml", "json"))
    # A restarted sink goes on numbering after what is there and keeps the bound.
    keeper = MailKeeper(kept.keep_dir, last=5)
    assert keeper.keep({"subject": "later"}, b"Subject: later\r\n\r\nx\r\n") == 8
    assert kept_ids(kept.keep_dir) == [4, 5, 6, 7, 8]


def test_a_sink_without_keep_writes_no_copy(sink: Any, tmp_path: Path) -> None:
    _send(sink.port, _mail("a@example.com", "Hi", None, "x\n"))
    assert sink.keep_dir is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sink.jsonl"]


def test_a_received_message_is_listed_and_shown_as_the_recipient_sees_it(
        demo_app: Any, kept: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(demo_app.test_client(), make_user("admin"))
    empty = admin.get("/demo/mail/").get_data(as_text=True)
    assert "received nothing yet" in empty
    body = (f'<!DOCTYPE html><html><head><title>t</title></head><body>'
            f'<p>Please <a href="{CONFIRM}">confirm</a></p><a href="{TRACKED}">Read</a>'
            f'<script>alert(1)</script></body></html>')
    _send(kept.port, _mail("Ana <ana@example.org>", "Confirm <b>your</b> subscription",
                           body, f"Confirm: {CONFIRM}\n"))
    _send(kept.port, _mail("bob@example.org", "Second", None,
                           "plain only, see http://x.test/a?b=1&c=<i>2</i>.\n"
                           'and http://y.test/"onmouseover="alert(1)\n'))

    page = admin.get("/demo/mail/").get_data(as_text=True)
    assert page.index("Second") < page.index("Confirm &lt;b&gt;your&lt;/b&gt; subscription")
    assert "<b>your</b>" not in page  # the subject is untrusted: escaped
    assert 'href="/demo/mail/1"' in page and "ana@example.org" in page
    assert "Demo mail" in page  # in the navigation
    found = admin.get("/demo/mail/?q=ANA@").get_data(as_text=True)
    assert "ana@example.org" in found and "bob@example.org" not in found
    none = admin.get("/demo/mail/?q=nobody@").get_data(as_text=True)
    assert "No received message" in none and "nobody@" in none

    shown = admin.get("/demo/mail/1").get_data(as_text=True)
    frame = re.search(r'<iframe[^>]*id="mail-html"[^>]*>', shown)
    assert frame, shown
    assert 'sandbox="allow-popups allow-popups-to-escape-sandbox"' in frame[0]
    assert 'src="/demo/mail/1/body.html"' in frame[0]
    assert (f'Confirm: <a href="{CONFIRM}" target="_blank" rel="noopener noreferrer">'
            f"{CONFIRM}</a>") in shown  # the text part, its link clickable
    assert "List-Unsubscribe" in shown and "Ana &lt;ana@example.org&gt;" in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown  # raw source, escaped
    assert "<script>alert(1)" not in shown

    answer = admin.get("/demo/mail/1/body.html")
    assert answer.status_code == 200 and answer.mimetype == "text/html"
    csp = answer.headers["Content-Security-Policy"]
    assert csp.startswith("sandbox allow-popups allow-popups-to-escape-sandbox;")
    assert "allow-scripts" not in csp and "allow-same-origin" not in csp
    assert "script-src" not in csp and "default-src 'none'" in csp
    served = answer.get_data(as_text=True)
    assert served.startswith('<!DOCTYPE html><html><head><base target="_blank"><title>')
    assert f'href="{CONFIRM}"' in served
    assert f'href="{TRACKED}"' in served  # the link as sent, clickable

    plain = admin.get("/demo/mail/2").get_data(as_text=True)
    assert 'id="mail-html"' not in plain and "plain only" in plain
    # Text URLs are links too (a text-only confirmation can be clicked), escaped.
    assert ('<a href="http://x.test/a?b=1&amp;c=" target="_blank" rel="noopener noreferrer">'
            'http://x.test/a?b=1&amp;c=</a>&lt;i&gt;2&lt;/i&gt;.') in plain
    assert '<a href="http://y.test/" target="_blank"' in plain
    assert '"onmouseover="' not in plain and "<i>" not in plain
    assert admin.get("/demo/mail/2/body.html").status_code == 404
    assert admin.get("/demo/mail/99").status_code == 404


def test_only_admins_open_it(demo_app: Any, kept: Any,
                             make_user: Callable[..., dict[str, Any]]) -> None:
    _send(kept.port, _mail("a@example.org", "Hello", "<p>x</p>", None))
    for role in ("marketer", "support"):
        user = Browser(demo_app.test_client(), make_user(role))
        for path in ("/demo/mail/", "/demo/mail/1", "/demo/mail/1/body.html"):
            assert user.get(path).status_code == 403, (role, path)
        assert "Demo mail" not in user.get("/account/").get_data(as_text=True)
    anonymous = demo_app.test_client().get("/demo/mail/1")
    assert anonymous.status_code == 302 and "/login" in anonymous.headers["Location"]


def test_outside_the_demo_there_is_no_such_page(app: Any,
                                                make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(app.test_client(), make_user("admin"))
    assert "demo_mail.index" not in app.view_functions
    assert admin.get("/demo/mail/").status_code == 404
    assert "Demo mail" not in admin.get("/account/").get_data(as_text=True)


def test_the_pages_speak_spanish(demo_app: Any, kept: Any,
                                 make_user: Callable[..., dict[str, Any]]) -> None:
    _send(kept.port, _mail("a@example.org", "Hola", "<p>x</p>", "x\n"))
    admin = Browser(demo_app.test_client(), make_user("admin"))
    spanish = {"headers": {"Accept-Language": "es"}}
    listing = admin.get("/demo/mail/", **spanish).get_data(as_text=True)
    assert "Correo de la demo" in listing and "Destinatarios" in listing
    assert "Demo mail" not in listing
    shown = admin.get("/demo/mail/1", **spanish).get_data(as_text=True)
    assert "Los enlaces se abren en una pestaña nueva" in shown and "Código fuente" in shown
    empty = admin.get("/demo/mail/?q=zz", **spanish).get_data(as_text=True)
    assert "Ningún mensaje recibido" in empty
