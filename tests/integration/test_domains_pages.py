"""The Sending domains page and the campaign review page's deliverability warnings, with
the DNS checks asking a local DNS server."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from harness.dns import DnsServer
from tests.helpers import Browser
from webapp import create_app
from webapp.domain import audit, campaigns, lists, sending_domains
from workers.building import dkim
from workers.core.settings import Config


@pytest.fixture()
def dns_app(engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
            dns_server: DnsServer) -> Any:
    sending_domains.forget()
    application = create_app(config_for(sink.port, DNS_RESOLVER=dns_server.resolver_setting,
                                        FROM="Tests <tests@example.com>"), engine=engine)
    application.config["TESTING"] = True
    yield application
    sending_domains.forget()


def page_text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return html.unescape(response.get_data(as_text=True))


def test_generate_a_key_publish_it_and_the_checks_turn_ok(
        dns_app: Any, engine: sa.Engine, dns_server: DnsServer,
        make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(dns_app.test_client(), make_user("admin"))
    index = page_text(admin.get("/admin/domains"))
    assert "example.com" in index and "SENDDOCK_FROM" in index and "unsigned" in index
    page = page_text(admin.post("/admin/domains/keys", {"domain": "Example.COM",
                                                        "algorithm": "rsa"}))
    assert "signed with it from now on" in page
    with engine.connect() as conn:
        (key,) = dkim.list_keys(conn, "example.com")
        assert audit.entries(conn, target="domain:example.com")[0]["action"] == "dkim.create"
    # The exact record, in a <pre> the copy button names; the script is a file (CSP).
    raw = admin.get("/admin/domains/example.com").get_data(as_text=True)
    assert f'<pre id="record-sd1">{key.record_value}</pre>' in raw
    assert 'data-copy="record-sd1"' in raw and "/static/js/copy.js" in raw
    assert "<script>" not in raw
    assert "no DKIM record is published at sd1._domainkey.example.com" in page
    zone = dns_server.zone
    zone.txt(key.record_name, key.record_value)
    zone.txt("example.com", "v=spf1 ip4:127.0.0.1 -all")
    zone.txt("_dmarc.example.com", "v=DMARC1; p=none")
    zone.add("example.com", "MX", "mx.example.com")
    cached = page_text(admin.get("/admin/domains/example.com"))
    assert "no DKIM record is published" in cached  # kept for a minute...
    fresh = page_text(admin.get("/admin/domains/example.com?fresh=1"))  # ...unless asked
    assert "no DKIM record is published" not in fresh
    assert re.search(r"Checks <span class=\"badge badge-ok\">ok</span>", fresh), fresh


def test_rotation_from_the_page(dns_app: Any, engine: sa.Engine,
                                make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(dns_app.test_client(), make_user("admin"))
    admin.post("/admin/domains/keys", {"domain": "example.com", "algorithm": "rsa"})
    page = page_text(admin.post("/admin/domains/keys", {"domain": "example.com",
                                                        "algorithm": "rsa"}))
    assert "created as the next key" in page
    third = page_text(admin.post("/admin/domains/keys", {"domain": "example.com",
                                                         "algorithm": "rsa"}))
    assert "already has an active and a next rsa key" in third
    page = page_text(admin.post("/admin/domains/example.com/keys/sd2/activate"))
    assert "sd2._domainkey.example.com signs example.com's mail now" in page
    page = page_text(admin.post("/admin/domains/example.com/keys/sd2/delete"))
    assert "signs its mail: activate another key first" in page
    page_text(admin.post("/admin/domains/example.com/keys/sd1/delete"))
    with engine.connect() as conn:
        assert [(k.selector, k.status) for k in dkim.list_keys(conn)] == [("sd2", "active")]


@pytest.mark.parametrize("role", ["marketer", "support"])
def test_only_admins_reach_it(dns_app: Any, role: str,
                              make_user: Callable[..., dict[str, Any]]) -> None:
    other = Browser(dns_app.test_client(), make_user(role))
    assert other.get("/admin/domains").status_code == 403
    assert other.post("/admin/domains/keys", {"domain": "example.com"},
                      follow_redirects=False).status_code == 403


def _free_mail_campaign(conn: sa.Connection) -> dict[str, Any]:
    """A draft From a gmail.com address, without an unsubscribe link, on a new list."""
    lst = lists.create_list(conn, "L")
    lists.add_subscribers(conn, lst["id"], [{"email": "a@example.org"}])
    return campaigns.create(conn, {"name": "Free", "list_id": lst["id"], "subject": "Hi",
                                   "from": "Me <me@gmail.com>", "text": "no link here"},
                            default_from="news@example.com")


def test_review_warns_about_the_from_domain_free_mail_and_the_unsubscribe_link(
        dns_app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        free = _free_mail_campaign(conn)
        lst = {"id": free["list_id"]}
        good = campaigns.create(conn, {
            "name": "Good", "list_id": lst["id"], "subject": "Hi", "from": "news@example.com",
            "html": '<p><a href="{{ unsubscribe_url }}">Unsubscribe</a></p>'},
            default_from="news@example.com")
    marketer = Browser(dns_app.test_client(), make_user("marketer"))
    page = page_text(marketer.get(f"/campaigns/{free['id']}/send"))
    assert "Will it reach the inbox?" in page
    assert "gmail.com is a free-mail domain" in page
    assert "no visible unsubscribe link" in page
    assert "An admin can fix the DNS records" in page  # no link a marketer cannot open
    other = page_text(marketer.get(f"/campaigns/{good['id']}/send"))
    assert "no visible unsubscribe link" not in other
    assert "mail From example.com goes out unsigned" in other  # no key, empty zone
    assert "no SPF record" in other


def test_visible_unsubscribe_is_read_from_the_part_readers_see() -> None:
    see = sending_domains.has_visible_unsubscribe
    assert see("{{ unsubscribe_url }}", None)
    assert see(None, '<a href="{{unsubscribe_url}}">x</a>')
    assert not see("{{ unsubscribe_url }}", "<p>only html, no link</p>")
    assert not see("unsubscribe_url without braces", None)


def test_the_checks_and_their_fixes_in_spanish(
        dns_app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    """The verdicts and the "what to do" lines are built by domain_checks (which the CLI
    prints in English) and shown in the page's language."""
    client = dns_app.test_client()
    client.environ_base["HTTP_ACCEPT_LANGUAGE"] = "es"
    admin = Browser(client, make_user("admin"))
    page = page_text(admin.post("/admin/domains/keys", {"domain": "example.com",
                                                        "algorithm": "rsa"}))
    assert "Clave sd1 creada: desde ahora firma el correo de example.com." in page
    assert "no hay ningún registro DKIM publicado en sd1._domainkey.example.com, pero el " \
        "correo se firma con ella" in page
    assert "example.com no tiene registro SPF" in page
    assert "no hay registro DMARC para example.com" in page
    assert 'publica _dmarc.example.com. 3600 IN TXT "v=DMARC1; p=none' in page
    assert "DMARC de example.com" in page and "SPF de example.com" in page
    assert "no SPF record" not in page and "publish " not in page
    bad = page_text(admin.post("/admin/domains/keys", {"domain": "not a domain",
                                                       "algorithm": "rsa"}))
    assert "'not a domain' no es un nombre de dominio válido" in bad
    with engine.begin() as conn:
        free = _free_mail_campaign(conn)
    review = page_text(admin.get(f"/campaigns/{free['id']}/send"))
    assert "gmail.com es un dominio de correo gratuito" in review
    assert "envía desde un dominio que sea tuyo" in review
