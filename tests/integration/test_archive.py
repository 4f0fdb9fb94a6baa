"""The public web version of a sent campaign: opt-in per campaign, at a
signed address that the messages carry as {{ archive_url }}, rendered for a neutral
stand-in (no recipient's data), answering only once the campaign is sent; anything else
is a clear 404."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import Browser, campaign_status
from webapp.domain import campaigns, lists, tracking
from workers.building import tracking as signing
from workers.core.settings import Config
from workers.delivery.pool import Pool

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()
HTML = """<html><body><p>Hello {{ name or "reader" }} ({{ email }}), plan {{ attributes.plan }}</p>
<p><a href="{{ archive_url }}">View in browser</a> · <a href="https://shop.example/">Shop</a>
· <a href="{{ unsubscribe_url }}">Unsubscribe</a></p></body></html>"""


def _campaign(engine: sa.Engine, *, archive: bool, text_only: bool = False,
              clicks: bool = False) -> int:
    with engine.begin() as conn:
        taken = conn.execute(sa.text(
            "SELECT count(*) FROM lists WHERE name LIKE 'Archive list%'")).scalar()
        lst = lists.create_list(conn, "Archive list" + (f" {taken + 1}" if taken else ""))
        lists.add_subscribers(conn, lst["id"], [
            {"email": "secret.person@example.org", "name": "Secret Person",
             "attributes": {"plan": "platinum"}}])
        body = {"text": "Hi {{ name }}, read it on the web: {{ archive_url }}"} if text_only \
            else {"html": HTML}
        campaign = campaigns.create(conn, {"name": "Edition 7", "list_id": lst["id"],
                                           "subject": "Edition 7 for {{ name }}", **body},
                                    default_from="news@example.com")
        tracking.save_settings(conn, campaign["id"], {"archive": archive,
                                                      "track_clicks": clicks}, actor="t")
    return int(campaign["id"])


def _send(engine: sa.Engine, config: Config, campaign_id: int) -> None:
    with engine.begin() as conn:
        campaigns.send(conn, campaign_id)
    pool = Pool(engine, config, node="test-node")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign_id) == "sent", timeout=60,
                 message="campaign to finish")
    finally:
        pool.stop()


def test_web_version_is_linked_from_the_email_and_shows_no_personal_data(
        client: Any, engine: sa.Engine, sink: Any, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    campaign_id = _campaign(engine, archive=True, clicks=True)
    url = signing.archive_url("http://127.0.0.1:5000", SECRET, campaign_id)
    path = url.removeprefix("http://127.0.0.1:5000")
    assert client.get(path).status_code == 404  # a draft has no web version yet
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get(f"/campaigns/{campaign_id}").get_data(as_text=True)
    assert f'href="{url}"' in page and "answers once the campaign is sent" in page
    _send(engine, config_for(sink.port), campaign_id)
    (raw,) = sink.raw_messages()
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, email.message.EmailMessage)
    html_part = message.get_body(preferencelist=("html",))
    assert html_part is not None
    html = str(html_part.get_content())
    # The "view in browser" link is the archive address itself, never a tracking URL.
    assert f'<a href="{url}">View in browser</a>' in html
    assert "Secret Person" in html  # the recipient's own message is personal

    r = client.get(path)
    body = r.get_data(as_text=True)
    assert r.status_code == 200 and r.mimetype == "text/html"
    assert "Hello Subscriber (subscriber@example.com), plan </p>" in body
    assert "<title>Edition 7 for Subscriber</title>" in body
    assert "Secret Person" not in body and "secret.person" not in body
    assert "platinum" not in body
    assert 'href="https://shop.example/"' in body  # the campaign's own links, untracked
    assert "/r/" not in body and "/o/" not in body
    assert 'href="http://127.0.0.1:5000/u/preview"' in body
    assert r.headers["Content-Security-Policy"].startswith("sandbox")
    assert r.headers["X-Robots-Tag"] == "noindex"
    # Anyone may read it: no login needed (this client is logged in; a fresh one is not).
    assert client.application.test_client().get(path).status_code == 200


def test_off_forged_and_unknown_are_a_clear_404(client: Any, engine: sa.Engine, sink: Any,
                                               config_for: Callable[..., Config]) -> None:
    off_id = _campaign(engine, archive=False)
    _send(engine, config_for(sink.port), off_id)
    (raw,) = sink.raw_messages()
    assert b"/archive/" not in raw  # {{ archive_url }} renders as nothing when off
    token = signing.archive_token(SECRET, off_id)
    for bad in (token, token[:-3] + "abc", signing.archive_token("other-secret", off_id),
                signing.archive_token(SECRET, 10**9), "garbage"):
        r = client.get(f"/archive/{bad}")
        assert r.status_code == 404
        assert "No web version" in r.get_data(as_text=True)
    r = client.get(f"/archive/{token}?lang=es")
    assert r.status_code == 404 and "No hay versión web" in r.get_data(as_text=True)


def test_text_only_campaign_is_shown_as_text(client: Any, engine: sa.Engine, sink: Any,
                                            config_for: Callable[..., Config]) -> None:
    campaign_id = _campaign(engine, archive=True, text_only=True)
    _send(engine, config_for(sink.port), campaign_id)
    r = client.get(f"/archive/{signing.archive_token(SECRET, campaign_id)}")
    body = r.get_data(as_text=True)
    assert r.status_code == 200
    assert "<h1>Edition 7 for Subscriber</h1>" in body, body
    assert "Secret Person" not in body and 'class="web-version-text"' in body


def test_list_archive_page_lists_published_campaigns_only(
        client: Any, engine: sa.Engine, sink: Any, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    published = _campaign(engine, archive=True)
    _send(engine, config_for(sink.port), published)
    with engine.begin() as conn:
        list_id = conn.execute(sa.text("SELECT list_id FROM campaigns WHERE id = :c"),
                               {"c": published}).scalar_one()
        unpublished = campaigns.create(conn, {"name": "Private", "list_id": list_id,
                                              "subject": "Not on the web", "text": "x"},
                                       default_from="news@example.com")
        draft = campaigns.create(conn, {"name": "Draft", "list_id": list_id,
                                        "subject": "Draft on the web", "text": "x"},
                                 default_from="news@example.com")
        tracking.save_settings(conn, draft["id"], {"archive": True}, actor="t")
    _send(engine, config_for(sink.port), int(unpublished["id"]))
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get(f"/campaigns/{published}").get_data(as_text=True)
    found = re.search(r'href="http://127\.0\.0\.1:5000(/archive/list/[^"]+)" '
                      r'id="list-archive-link"', page)
    assert found, page
    anonymous = client.application.test_client()
    r = anonymous.get(found[1])
    body = r.get_data(as_text=True)
    assert r.status_code == 200 and "<h1>Archive list</h1>" in body
    web_version = signing.archive_url("http://127.0.0.1:5000", SECRET, published)
    assert f'<a href="{web_version}">Edition 7 for</a>' in body  # subject, no name in it
    assert "Secret" not in body
    assert "Not on the web" not in body and "Draft on the web" not in body
    assert "Private" not in body  # a campaign's name is internal
    for bad in (found[1][:-3] + "xyz", "/archive/list/garbage",
                signing.list_archive_url("", SECRET, 10**9)):
        r = anonymous.get(bad)
        assert r.status_code == 404 and "No web version" in r.get_data(as_text=True)


def test_web_version_keeps_the_campaigns_layout(
        client: Any, engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    """The web version is the message as sent, in its layout (header, footer, postal
    address), not the bare body."""
    from webapp.domain import layouts
    with engine.begin() as conn:
        layout = layouts.create(conn, {
            "name": "House", "postal_address": "Calle Mayor 1, Madrid",
            "html": "<html><head><title>ACME</title></head><body><header>ACME NEWS</header>"
                    "{{ content }}<footer>{{ postal_address }} · <a href=\"{{ unsubscribe_url"
                    " }}\">Unsubscribe</a></footer></body></html>"})
        lst = lists.create_list(conn, "Layout archive")
        lists.add_subscribers(conn, lst["id"], [{"email": "x@example.org"}])
        campaign = campaigns.create(conn, {
            "name": "Team news", "list_id": lst["id"], "subject": "Team news for {{ name }}",
            "html": "<p>Body text</p>", "layout_id": layout["id"]},
            default_from="news@example.com")
        tracking.save_settings(conn, campaign["id"], {"archive": True}, actor="t")
    _send(engine, config_for(sink.port), int(campaign["id"]))
    path = signing.archive_url("http://x", SECRET, int(campaign["id"])).removeprefix("http://x")
    body = client.get(path).get_data(as_text=True)
    assert "<header>ACME NEWS</header>" in body and "<p>Body text</p>" in body
    assert "Calle Mayor 1, Madrid" in body and "<title>ACME</title>" in body
    assert body.count("<title") == 1  # the layout's own title is kept, none added


def test_the_preview_shows_the_view_in_browser_link_the_messages_will_carry(
        engine: sa.Engine) -> None:
    """{{ archive_url }} rendered empty in the preview while the web version was on."""
    campaign_id = _campaign(engine, archive=True)
    with engine.connect() as conn:
        shown = campaigns.preview(conn, campaign_id, base_url="http://x", secret_key=SECRET)
    url = signing.archive_url("http://x", SECRET, campaign_id)
    assert f'<a href="{url}">View in browser</a>' in shown["rendered"].html
    off = _campaign(engine, archive=False)
    with engine.connect() as conn:
        shown = campaigns.preview(conn, off, base_url="http://x", secret_key=SECRET)
    assert '<a href="">View in browser</a>' in shown["rendered"].html
