"""Unsubscribe: signed per-recipient links that cannot be forged, a GET that never
unsubscribes by itself, a CSRF-protected confirm button, and RFC 8058 one-click POST
without a session; later campaigns skip the address."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from itsdangerous import URLSafeSerializer

from tests.helpers import make_campaign, suppressed
from webapp.domain import campaigns, lists
from workers.building.links import make_token, read_token
from workers.delivery import enqueue

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()


def _subscriber(engine: sa.Engine, address: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT id FROM subscribers WHERE email = :e"),
                                {"e": address}).scalar_one())


def _status(engine: sa.Engine, subscriber_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT status FROM subscribers WHERE id = :id"),
                                {"id": subscriber_id}).scalar_one())


def test_tokens_cannot_be_forged(client: Any, engine: sa.Engine) -> None:
    campaign = make_campaign(engine, ["a@example.org", "b@example.org"], send=False)
    a, b = _subscriber(engine, "a@example.org"), _subscriber(engine, "b@example.org")
    genuine = make_token(SECRET, a, campaign["id"])
    assert read_token(SECRET, genuine) == (a, campaign["id"])
    forged = [
        URLSafeSerializer("another-secret", salt="senddock-unsubscribe-v1").dumps([b, None]),
        genuine.rsplit(".", 1)[0] + ".AAAAAAAAAAAAAAAAAAAAAAAAAAA",  # payload, bad signature
        URLSafeSerializer(SECRET, salt="other-salt").dumps([b, None]),
        "garbage",
    ]
    for token in forged:
        assert read_token(SECRET, token) is None
        assert client.get(f"/u/{token}").status_code == 404
        assert client.post(f"/u/{token}", data={"List-Unsubscribe": "One-Click"}
                           ).status_code == 404
    assert suppressed(engine) == set()
    assert _status(engine, b) == "active"


def test_get_only_asks_and_the_button_unsubscribes(client: Any, engine: sa.Engine) -> None:
    make_campaign(engine, ["Reader@Example.org"], send=False)
    sid = _subscriber(engine, "Reader@example.org")
    token = make_token(SECRET, sid, None)
    page = client.get(f"/u/{token}")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "Unsubscribe?" in text and "Reader@example.org" in text
    assert suppressed(engine) == set() and _status(engine, sid) == "active"  # GET changed nothing
    no_csrf = client.post(f"/u/{token}/confirm")
    assert no_csrf.status_code == 400 and suppressed(engine) == set()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', text)
    assert csrf
    done = client.post(f"/u/{token}/confirm", data={"csrf_token": csrf[1]})
    assert "You are unsubscribed" in done.get_data(as_text=True)
    assert suppressed(engine) == {"reader@example.org"}
    assert _status(engine, sid) == "unsubscribed"
    again = client.get(f"/u/{token}").get_data(as_text=True)
    assert "already unsubscribed" in again
    with engine.connect() as conn:
        reason = conn.execute(sa.text("SELECT reason FROM suppressions")).scalar_one()
        actions = set(conn.execute(sa.text("SELECT action FROM audit_log")).scalars())
    assert reason == "unsubscribed"
    assert {"suppression.add", "subscriber.unsubscribe"} <= actions


def test_one_click_post_without_session_and_later_campaigns_skip(
        app: Any, engine: sa.Engine) -> None:
    campaign = make_campaign(engine, ["one@example.org", "two@example.org"], send=False)
    sid = _subscriber(engine, "one@example.org")
    token = make_token(SECRET, sid, campaign["id"])
    fresh = app.test_client()  # no cookie, no CSRF token: a mail client
    wrong = fresh.post(f"/u/{token}", data={"something": "else"})
    assert wrong.status_code == 400 and suppressed(engine) == set()
    r = fresh.post(f"/u/{token}", data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200, r.get_data(as_text=True)
    assert suppressed(engine) == {"one@example.org"}
    assert fresh.post(f"/u/{token}", data={"List-Unsubscribe": "One-Click"}).status_code == 200
    with engine.begin() as conn:
        assert campaigns.audience(conn, campaign["list_id"])["will_receive"] == 1
        campaigns.send(conn, campaign["id"])
    with engine.begin() as conn:
        summary = enqueue.enqueue_broadcast(conn, campaigns.get(conn, campaign["id"])
                                          ["broadcast_id"])
        emails = set(conn.execute(sa.text("SELECT email FROM delivery_jobs")).scalars())
    assert summary == {"total": 1, "skipped_suppressed": 1, "skipped_inactive": 0}
    assert emails == {"two@example.org"}


def test_placeholder_link_of_test_messages_explains_itself(client: Any) -> None:
    page = client.get("/u/test-message")
    assert page.status_code == 404
    assert "unsubscribe link of a test or preview message" in page.get_data(as_text=True)


def test_unsubscribing_twice_keeps_first_reason(engine: sa.Engine) -> None:
    from webapp.domain import unsubscribe_links
    from webapp.domain.suppressions import suppress

    with engine.begin() as conn:
        lst = lists.create_list(conn, "L")
        lists.add_subscribers(conn, lst["id"], [{"email": "x@example.org"}])
        suppress(conn, "x@example.org", "bounced", actor="t")
    token = make_token(SECRET, _subscriber(engine, "x@example.org"), None)
    with engine.begin() as conn:
        unsubscribe_links.unsubscribe(conn, SECRET, token, via="test")
        reason = conn.execute(sa.text("SELECT reason FROM suppressions")).scalar_one()
    assert reason == "bounced"


def test_the_unsubscribe_page_names_the_sender_and_the_list(client: Any,
                                                            engine: sa.Engine) -> None:
    campaign = make_campaign(engine, ["reader@example.org"], name="Weekly")
    with engine.connect() as conn:
        subscriber = conn.execute(sa.text("SELECT id FROM subscribers")).scalar_one()
    token = make_token(SECRET, subscriber, campaign["id"])
    page = client.get(f"/u/{token}").get_data(as_text=True)
    assert "from <strong>news@example.com</strong>" in page
    assert "on their list “Weekly list”" in page
