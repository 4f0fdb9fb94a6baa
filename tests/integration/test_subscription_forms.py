"""Subscription forms with double opt-in, against real PostgreSQL: the
form per list (marketers turn it on), the public form and API (anyone), the confirmation
email as a critical transactional kind, the signed confirmation link, consent kept and
exported, honeypot and per-IP rate limit, and answers that do not tell who is subscribed."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from markupsafe import escape

from tests.helpers import Browser
from webapp.domain import campaigns, lists, subscriptions
from workers import queue
from workers.core.states import CLASS_PRIORITY, PRIORITY

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()


def _list(engine: sa.Engine, *, enabled: bool = True, name: str = "Weekly news") -> int:
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, name)["id"])
        subscriptions.save_form(conn, list_id, enabled=enabled, title="", intro="Once a week.",
                                accent="#aa3300", actor="t")
    return list_id


def _form_token(client: Any, list_id: int, lang: str = "en") -> str:
    page = client.get(f"/subscribe/{list_id}?lang={lang}").get_data(as_text=True)
    found = re.search(r'name="form_token" value="([^"]+)"', page)
    assert found, page
    return found[1]


def _submit(client: Any, list_id: int, email: str, **extra: str) -> Any:
    data = {"form_token": _form_token(client, list_id), "email": email, "name": "Ada",
            "website": "", **extra}
    return client.post(f"/subscribe/{list_id}", data=data)


def _requests(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM subscription_requests ORDER BY id")).mappings()]


def _confirmations(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE kind = 'subscription_confirmation' ORDER BY id")
        ).mappings()]


def _members(engine: sa.Engine, list_id: int) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.email: r.status for r in conn.execute(sa.text(
            "SELECT s.email, s.status FROM memberships m JOIN subscribers s "
            "ON s.id = m.subscriber_id WHERE m.list_id = :l"), {"l": list_id})}


def _confirm_path(job: dict[str, Any]) -> str:
    url = job["payload"]["data"]["confirm_url"]
    assert url.startswith("http://127.0.0.1:5000/subscribe/confirm/"), url
    return url.removeprefix("http://127.0.0.1:5000")


def test_marketer_turns_the_form_on_and_sees_its_link_and_snippet(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list(engine, enabled=False)
    assert client.get(f"/subscribe/{list_id}").status_code == 409  # off: no form
    marketer = Browser(client, make_user("marketer"))
    page = marketer.get(f"/lists/{list_id}").get_data(as_text=True)
    assert 'id="subscription-form"' in page and 'id="embed-snippet"' not in page
    r = marketer.post(f"/lists/{list_id}/form", {"enabled": "on", "title": "Join us",
                                                 "intro": "Tips every Monday.",
                                                 "accent": "#123abc"})
    page = r.get_data(as_text=True)
    assert r.status_code == 200 and "Subscription form saved." in page
    assert f"http://127.0.0.1:5000/subscribe/{list_id}" in page
    assert str(escape(subscriptions.embed_snippet(
        f"http://127.0.0.1:5000/subscribe/{list_id}", "Join us"))) in page
    public = client.get(f"/subscribe/{list_id}").get_data(as_text=True)
    assert "Join us" in public and "Tips every Monday." in public
    css = client.get(f"/subscribe/{list_id}/form.css")
    assert css.mimetype == "text/css" and "#123abc" in css.get_data(as_text=True)
    bad = marketer.post(f"/lists/{list_id}/form", {"enabled": "on", "accent": "red;}"})
    assert "Form not saved" in bad.get_data(as_text=True)
    assert "#123abc" in client.get(f"/subscribe/{list_id}/form.css").get_data(as_text=True)


def test_only_marketers_and_admins_manage_forms(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = _list(engine, enabled=False)
    support = Browser(client, make_user("support"))
    assert support.post(f"/lists/{list_id}/form", {"enabled": "on"},
                        follow_redirects=False).status_code == 403
    assert client.get(f"/subscribe/{list_id}").status_code == 409  # still off
    client.post("/logout", data={"csrf_token": support.token})
    admin = Browser(client, make_user("admin"))
    assert admin.post(f"/lists/{list_id}/form", {"enabled": "on", "accent": "#000000"},
                      follow_redirects=False).status_code == 303
    assert client.get(f"/subscribe/{list_id}").status_code == 200


def test_a_visitor_subscribes_pending_until_the_link_is_confirmed(
        client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    r = _submit(client, list_id, "Ada@Example.org")
    assert r.status_code == 200 and 'id="subscribe-done"' in r.get_data(as_text=True)
    [req] = _requests(engine)
    assert (req["list_id"], req["email"], req["source"], req["remote_addr"]) == \
        (list_id, "Ada@example.org", "form", "127.0.0.1")
    assert req["requested_at"] is not None and req["confirmed_at"] is None
    [job] = _confirmations(engine)
    assert job["priority"] == CLASS_PRIORITY["critical"] < PRIORITY["broadcast"]  # P7
    assert job["email"] == "Ada@example.org" and job["status"] == "pending"
    assert job["payload"]["data"]["list_name"] == "Weekly news"
    assert _members(engine, list_id) == {}  # pending is not a membership
    path = _confirm_path(job)
    page = client.get(path)
    assert page.status_code == 200 and "Yes, subscribe me" in page.get_data(as_text=True)
    assert _members(engine, list_id) == {}  # a GET (a link scanner) confirms nothing
    done = client.post(path)  # no session, no CSRF token: the signed link is the proof
    assert done.status_code == 200 and 'id="confirmed"' in done.get_data(as_text=True)
    assert _members(engine, list_id) == {"Ada@example.org": "active"}
    [req] = _requests(engine)
    assert req["confirmed_at"] is not None and req["confirmed_addr"] == "127.0.0.1"
    again = client.post(path)  # confirming twice is confirming once
    assert again.status_code == 200 and _members(engine, list_id) == {
        "Ada@example.org": "active"}
    assert _requests(engine)[0]["confirmed_at"] == req["confirmed_at"]


def test_pending_addresses_are_never_sent_campaigns(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "member@example.org"}])
    _submit(client, list_id, "pending@example.org")
    with engine.begin() as conn:
        campaign = campaigns.create(conn, {"name": "c", "list_id": list_id, "subject": "Hi",
                                           "text": "Hi {{ unsubscribe_url }}"},
                                    default_from="news@example.com")
        campaign = campaigns.send(conn, campaign["id"])
        summary = queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        emails = set(conn.execute(sa.text(
            "SELECT email FROM delivery_jobs WHERE kind = 'broadcast'")).scalars())
    assert emails == {"member@example.org"}
    assert summary is not None and summary["total"] == 1


def test_confirmation_links_are_signed_and_expire(
        client: Any, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    list_id = _list(engine)
    _submit(client, list_id, "ada@example.org")
    path = _confirm_path(_confirmations(engine)[0])
    token = path.rsplit("/", 1)[1]
    for forged in (subscriptions.confirm_token("another-secret", 1),
                   token[:-3] + "AAA", "garbage"):
        assert client.get(f"/subscribe/confirm/{forged}").status_code == 404
        assert client.post(f"/subscribe/confirm/{forged}").status_code == 404
    monkeypatch.setattr(subscriptions, "CONFIRM_MAX_AGE", -1)  # every link is now too old
    r = client.post(path)
    assert r.status_code == 404 and "expired" in r.get_data(as_text=True)
    assert _members(engine, list_id) == {}


def test_consent_is_exported_with_the_list(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "imported@example.org"}])
    _submit(client, list_id, "ada@example.org")
    client.post(_confirm_path(_confirmations(engine)[0]))
    with engine.connect() as conn:
        rows = {r["email"]: r for r in csv.DictReader(io.StringIO(
            "".join(lists.export_csv(conn, list_id))))}
    ada = rows["ada@example.org"]
    assert ada["consent_form"] == f"form (list {list_id})"
    assert ada["consent_ip"] == "127.0.0.1" and ada["confirmed_ip"] == "127.0.0.1"
    assert ada["consent_at"] and ada["confirmed_at"] >= ada["consent_at"]
    assert [rows["imported@example.org"][c] for c in lists.CONSENT_COLUMNS] == [""] * 5


def test_the_honeypot_is_answered_like_anyone_and_nothing_happens(
        client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    r = _submit(client, list_id, "bot@example.org", website="http://spam.example")
    assert r.status_code == 200 and 'id="subscribe-done"' in r.get_data(as_text=True)
    assert _requests(engine) == [] and _confirmations(engine) == []


def test_the_form_post_needs_a_genuine_form_token(client: Any, engine: sa.Engine) -> None:
    list_id, other = _list(engine), _list(engine, name="Other")
    for token in ("", "forged", subscriptions.form_token("another-secret", list_id),
                  _form_token(client, other)):  # a token for another list
        r = client.post(f"/subscribe/{list_id}", data={"form_token": token,
                                                      "email": "ada@example.org"})
        assert r.status_code == 400 and "out of date" in r.get_data(as_text=True)
    assert _requests(engine) == []


def test_requests_per_ip_are_limited(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    for i in range(subscriptions.RATE_PER_HOUR):
        r = client.post(f"/api/v1/lists/{list_id}/subscribe",
                        json={"email": f"a{i}@example.org"})
        assert r.status_code == 202, r.get_json()
    r = client.post(f"/api/v1/lists/{list_id}/subscribe", json={"email": "late@example.org"})
    assert r.status_code == 429 and r.headers["Retry-After"] == "3600"
    assert "too many" in r.get_json()["error"]["message"]
    form = _submit(client, list_id, "late@example.org")
    assert form.status_code == 429 and "too many" in form.get_data(as_text=True)
    # Another address is not limited (the limit is per IP).
    other = client.post(f"/api/v1/lists/{list_id}/subscribe", json={"email": "b@example.org"},
                        environ_base={"REMOTE_ADDR": "192.0.2.7"})
    assert other.status_code == 202
    assert len(_requests(engine)) == subscriptions.RATE_PER_HOUR + 1


def test_the_answer_does_not_tell_who_is_subscribed(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    with engine.begin() as conn:
        lists.add_subscribers(conn, list_id, [{"email": "member@example.org"}])
    member = client.post(f"/api/v1/lists/{list_id}/subscribe",
                         json={"email": "member@example.org"})
    stranger = client.post(f"/api/v1/lists/{list_id}/subscribe",
                           json={"email": "stranger@example.org"})
    assert (member.status_code, member.get_json()) == (stranger.status_code,
                                                       stranger.get_json())
    assert [j["email"] for j in _confirmations(engine)] == ["stranger@example.org"]
    page_member = _submit(client, list_id, "member@example.org").get_data(as_text=True)
    page_stranger = _submit(client, list_id, "other@example.org").get_data(as_text=True)
    strip = re.compile(r'name="form_token" value="[^"]+"')
    assert strip.sub("", page_member) == strip.sub("", page_stranger)


def test_a_second_request_within_the_window_sends_no_second_email(
        client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    _submit(client, list_id, "ada@example.org")
    _submit(client, list_id, "ADA@example.org")
    assert len(_confirmations(engine)) == 1 and len(_requests(engine)) == 1
    client.post(_confirm_path(_confirmations(engine)[0]))
    assert _members(engine, list_id) == {"ada@example.org": "active"}


def test_bad_input_is_answered_clearly(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    off = _list(engine, enabled=False, name="Closed")
    r = client.post(f"/api/v1/lists/{list_id}/subscribe", json={"email": "not-an-address"})
    assert r.status_code == 422 and "email" in r.get_json()["error"]["fields"]
    r = client.post(f"/api/v1/lists/{list_id}/subscribe", json={"email": "a@example.org",
                                                               "plan": "pro"})
    assert r.status_code == 422 and r.get_json()["error"]["fields"] == {
        "plan": "unknown field"}
    r = client.post(f"/api/v1/lists/{list_id}/subscribe", data="x",
                    content_type="text/plain")
    assert r.status_code == 400
    for missing, status, message in ((off, 409, "this list's subscription form is off"),
                                     (999999, 404, "there is no subscription form here")):
        r = client.post(f"/api/v1/lists/{missing}/subscribe", json={"email": "a@example.org"})
        assert r.status_code == status and r.get_json()["error"]["message"] == message
        assert client.get(f"/subscribe/{missing}").status_code == status
    form = _submit(client, list_id, "nope")
    assert form.status_code == 422 and 'id="subscribe-error"' in form.get_data(as_text=True)
    assert 'value="nope"' in form.get_data(as_text=True)  # what was typed is kept
    assert _requests(engine) == [] and _confirmations(engine) == []


def test_form_and_confirmation_speak_spanish(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    page = client.get(f"/subscribe/{list_id}?lang=es").get_data(as_text=True)
    assert 'lang="es"' in page and "Suscribirme" in page
    r = client.post(f"/subscribe/{list_id}", data={
        "form_token": _form_token(client, list_id, "es"), "email": "ana@example.org",
        "lang": "es"})
    assert "revisa tu correo" in r.get_data(as_text=True)
    [job] = _confirmations(engine)
    assert job["payload"]["data"]["locale"] == "es"
    confirm = client.get(_confirm_path(job)).get_data(as_text=True)  # the request's language
    assert 'lang="es"' in confirm and "Sí, suscribirme" in confirm


def test_only_the_public_form_may_be_framed(client: Any, engine: sa.Engine) -> None:
    list_id = _list(engine)
    form = client.get(f"/subscribe/{list_id}")
    assert "X-Frame-Options" not in form.headers
    assert "frame-ancestors *" in form.headers["Content-Security-Policy"]
    login = client.get("/login")
    assert login.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in login.headers["Content-Security-Policy"]


def test_someone_who_left_joins_again_only_by_confirming(client: Any, app: Any,
                                                         engine: sa.Engine) -> None:
    """Leaving a list through the message's link, then the public form
    sends a new confirmation email; the person is back on the list only once it is
    confirmed (a new consent kept), never silently."""
    from workers.building.links import make_token

    list_id = _list(engine)
    _submit(client, list_id, "ada@example.org")
    client.post(_confirm_path(_confirmations(engine)[0]))
    assert _members(engine, list_id) == {"ada@example.org": "active"}
    with engine.connect() as conn:
        sid = conn.execute(sa.text("SELECT id FROM subscribers")).scalar_one()
    fresh = app.test_client()
    assert fresh.post(f"/u/{make_token(SECRET, sid, None)}",
                      data={"List-Unsubscribe": "One-Click"}).status_code == 200
    assert _members(engine, list_id) == {}
    with engine.begin() as conn:  # let the dedupe window of the first email pass
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval "
                             "'2 days', dedupe_until = now() - interval '1 day'"))
    r = _submit(client, list_id, "ada@example.org")
    assert r.status_code == 200 and 'id="subscribe-done"' in r.get_data(as_text=True)
    _first, second = _confirmations(engine)
    assert second["email"] == "ada@example.org" and second["status"] == "pending"
    assert _members(engine, list_id) == {}  # not before confirming
    assert client.post(_confirm_path(second)).status_code == 200
    assert _members(engine, list_id) == {"ada@example.org": "active"}
    reqs = _requests(engine)
    assert len(reqs) == 2 and all(r["confirmed_at"] is not None for r in reqs)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM list_unsubscribes")).scalar() == 0
