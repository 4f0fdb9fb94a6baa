"""Unsubscribe links and the preference page: signed per-recipient links
that cannot be forged, a GET that never unsubscribes by itself, a CSRF-protected button that
leaves the message's list and only that one, RFC 8058 one-click without a session leaving
the list the message came from, leaving one or all lists and choosing the language on the
page (both languages), later campaigns of that list skipping the person, and joining again
only through the public form's double opt-in."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from itsdangerous import URLSafeSerializer

from tests.helpers import make_campaign, suppressed
from webapp.domain import campaigns, lists
from workers import queue
from workers.building.links import make_token, read_token

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()


def _subscriber(engine: sa.Engine, address: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT id FROM subscribers WHERE lower(email) = lower(:e)"),
            {"e": address}).scalar_one())


def _status(engine: sa.Engine, subscriber_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT status FROM subscribers WHERE id = :id"),
                                {"id": subscriber_id}).scalar_one())


def _on(engine: sa.Engine, subscriber_id: int) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT l.name FROM memberships m JOIN lists l ON l.id = m.list_id "
            "WHERE m.subscriber_id = :s"), {"s": subscriber_id}).scalars())


def _csrf(text: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', text)
    assert found, text
    return found[1]


def _two_lists(engine: sa.Engine, email: str) -> tuple[dict[str, Any], dict[str, Any], int]:
    """A campaign to "Weekly list" and a second list "Offers", both holding ``email``."""
    campaign = make_campaign(engine, [email, "other@example.org"], name="Weekly", send=False)
    with engine.begin() as conn:
        offers = lists.create_list(conn, "Offers")
        lists.add_subscribers(conn, offers["id"], [{"email": email}])
    return campaign, offers, _subscriber(engine, email)


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
        assert client.post(f"/u/{token}/preferences", data={"leave_all": "1"}
                           ).status_code in (400, 404)
    assert _on(engine, b) == {"Test campaign list"}


def test_get_only_asks_and_the_button_leaves_only_that_list(client: Any,
                                                            engine: sa.Engine) -> None:
    campaign, _offers, sid = _two_lists(engine, "Reader@Example.org")
    token = make_token(SECRET, sid, campaign["id"])
    page = client.get(f"/u/{token}")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "Unsubscribe?" in text and "Reader@example.org" in text
    assert "Offers" in text and "Weekly list" in text  # the lists the person is on
    assert _on(engine, sid) == {"Weekly list", "Offers"}  # GET changed nothing
    assert client.post(f"/u/{token}/confirm").status_code == 400  # no CSRF token
    done = client.post(f"/u/{token}/confirm", data={"csrf_token": _csrf(text)})
    said = done.get_data(as_text=True)
    assert "You are unsubscribed" in said and "has left: Weekly list." in said
    assert "You are still on: Offers." in said
    assert _on(engine, sid) == {"Offers"}
    assert suppressed(engine) == set() and _status(engine, sid) == "active"  # not global
    again = client.get(f"/u/{token}").get_data(as_text=True)
    assert "is not on the list “Weekly list” any more" in again
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT list_id, campaign_id, via FROM list_unsubscribes"
                                   )).one()
        actions = list(conn.execute(sa.text("SELECT action FROM audit_log "
                                            "WHERE action = 'subscriber.unsubscribe'")))
    assert tuple(row) == (campaign["list_id"], campaign["id"], "unsubscribe page")
    assert len(actions) == 1


def test_one_click_leaves_the_message_list_and_its_campaigns_skip(
        app: Any, engine: sa.Engine) -> None:
    from workers.after_acceptance import event_queue

    campaign, offers, sid = _two_lists(engine, "one@example.org")
    with engine.begin() as conn:
        event_queue.create_endpoint(conn, url="http://127.0.0.1:28001/hook", secret="s",
                                    events=["unsubscribed"])
    token = make_token(SECRET, sid, campaign["id"])
    fresh = app.test_client()  # no cookie, no CSRF token: a mail client
    wrong = fresh.post(f"/u/{token}", data={"something": "else"})
    assert wrong.status_code == 400 and _on(engine, sid) == {"Weekly list", "Offers"}
    r = fresh.post(f"/u/{token}", data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200, r.get_data(as_text=True)
    assert fresh.post(f"/u/{token}", data={"List-Unsubscribe": "One-Click"}).status_code == 200
    assert _on(engine, sid) == {"Offers"} and suppressed(engine) == set()
    with engine.connect() as conn:  # the event webhook hears of it, once, naming the list
        [payload] = conn.execute(sa.text("SELECT payload FROM webhook_deliveries "
                                         "WHERE event = 'unsubscribed'")).scalars()
    assert payload["data"]["email"] == "one@example.org"
    assert payload["data"]["list_id"] == campaign["list_id"]
    with engine.begin() as conn:
        assert campaigns.audience(conn, campaign["list_id"])["will_receive"] == 1
        assert campaigns.audience(conn, offers["id"])["will_receive"] == 1
        campaigns.send(conn, campaign["id"])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaigns.get(conn, campaign["id"])
                                  ["broadcast_id"])
        emails = set(conn.execute(sa.text("SELECT email FROM delivery_jobs")).scalars())
    assert emails == {"other@example.org"}
    # A campaign to the other list still reaches the person.
    with engine.begin() as conn:
        other = campaigns.create(conn, {"name": "Deals", "list_id": offers["id"],
                                        "subject": "Deals", "text": "{{ unsubscribe_url }}"},
                                 default_from="news@example.com")
        campaigns.send(conn, other["id"])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaigns.get(conn, other["id"])["broadcast_id"])
        emails = set(conn.execute(sa.text("SELECT email FROM delivery_jobs "
                                          "WHERE campaign_id = :c"), {"c": other["id"]}
                                  ).scalars())
    assert emails == {"one@example.org"}
    # A marketer re-importing the address does not put them back on the list they left.
    with engine.begin() as conn:
        lists.add_subscribers(conn, campaign["list_id"], [{"email": "one@example.org"}])
    assert _on(engine, sid) == {"Offers"}


def test_leave_all_and_language_in_both_languages(client: Any, engine: sa.Engine) -> None:
    campaign, offers, sid = _two_lists(engine, "both@example.org")
    token = make_token(SECRET, sid, campaign["id"])
    page = client.get(f"/u/{token}", headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "¿Darte de baja?" in page and "Tus suscripciones" in page
    saved = client.post(f"/u/{token}/preferences", data={
        "csrf_token": _csrf(page), "leave": str(offers["id"]), "locale": "es"})
    said = saved.get_data(as_text=True)
    assert saved.status_code == 200
    assert "ha salido de: Offers." in said and "Sigues en: Weekly list." in said
    assert "Tu idioma ahora es español." in said
    # The chosen language wins over the browser's from now on.
    page = client.get(f"/u/{token}", headers={"Accept-Language": "en"}).get_data(as_text=True)
    assert "Tus suscripciones" in page
    bad = client.post(f"/u/{token}/preferences", data={"csrf_token": _csrf(page),
                                                       "leave": "999999"})
    assert bad.status_code == 422 and "no estás en esa lista" in bad.get_data(as_text=True)
    english = client.post(f"/u/{token}/preferences", data={
        "csrf_token": _csrf(page), "leave_all": "1", "locale": "en"}).get_data(as_text=True)
    assert "has left: Weekly list." in english
    assert "You are on no list any more" in english and "Your language is now English." in english
    assert _on(engine, sid) == set() and suppressed(engine) == set()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT locale FROM subscribers WHERE id = :s"),
                            {"s": sid}).scalar_one() == "en"
        assert conn.execute(sa.text("SELECT count(*) FROM list_unsubscribes")).scalar() == 2


def test_placeholder_link_of_test_messages_explains_itself(client: Any) -> None:
    page = client.get("/u/test-message")
    assert page.status_code == 404
    assert "unsubscribe link of a test or preview message" in page.get_data(as_text=True)


def test_a_link_naming_no_campaign_leaves_every_list(engine: sa.Engine) -> None:
    from webapp.domain import unsubscribe_links

    _campaign, _offers, sid = _two_lists(engine, "x@example.org")
    with engine.begin() as conn:
        result = unsubscribe_links.unsubscribe(conn, SECRET, make_token(SECRET, sid, None),
                                               via="test")
    assert sorted(result["left_now"]) == ["Offers", "Weekly list"]
    assert _on(engine, sid) == set() and suppressed(engine) == set()


def test_the_unsubscribe_page_names_the_sender_and_the_list(client: Any,
                                                            engine: sa.Engine) -> None:
    campaign = make_campaign(engine, ["reader@example.org"], name="Weekly")
    with engine.connect() as conn:
        subscriber = conn.execute(sa.text("SELECT id FROM subscribers")).scalar_one()
    token = make_token(SECRET, subscriber, campaign["id"])
    page = client.get(f"/u/{token}").get_data(as_text=True)
    assert "from <strong>news@example.com</strong>" in page
    assert "on their list “Weekly list”" in page


def test_the_preference_page_sets_the_tracking_consent(client: Any, engine: sa.Engine) -> None:
    campaign, _offers, sid = _two_lists(engine, "Tracked@Example.org")
    token = make_token(SECRET, sid, campaign["id"])
    page = client.get(f"/u/{token}").get_data(as_text=True)
    box = page.split('id="tracking-consent"', 1)[1].split("</label>", 1)[0]
    assert "checked" in box and "Allow open and click tracking" in box
    client.post(f"/u/{token}/preferences", data={"csrf_token": _csrf(page),
                                                 "tracking_shown": "1"})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT tracking FROM subscribers WHERE id = :s"),
                            {"s": sid}).scalar_one() is False
        assert conn.execute(sa.text("SELECT count(*) FROM audit_log WHERE action = "
                                    "'subscriber.tracking'")).scalar() == 1
    page = client.get(f"/u/{token}", headers={"Accept-Language": "es"}).get_data(as_text=True)
    box = page.split('id="tracking-consent"', 1)[1].split("</label>", 1)[0]
    assert "checked" not in box and "Permitir el seguimiento" in box
    client.post(f"/u/{token}/preferences", data={"csrf_token": _csrf(page),
                                                 "tracking_shown": "1", "tracking": "1"})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT tracking FROM subscribers WHERE id = :s"),
                            {"s": sid}).scalar_one() is True
