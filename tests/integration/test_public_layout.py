"""The pages anyone may open use the public layout (docs/design.md §34): the preference
page, the confirmation, the web version, a broken tracking link and their errors show no
admin navigation and no link to the dashboard, even to a logged-in user; an expired
confirmation link is answered in the requester's language."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser, make_campaign
from webapp.domain import lists, subscriptions
from workers.building.links import make_token

SECRET = "test-secret-key-not-for-production"  # tests/conftest.py settings()
ADMIN_MARKS = ('class="mainnav"', "Back to the dashboard", "Volver al panel", "Log out")


def _public(page: str) -> None:
    assert 'class="public-page"' in page, page
    for mark in ADMIN_MARKS:
        assert mark not in page, (mark, page)


def _spanish_request(client: Any, engine: sa.Engine) -> str:
    """A Spanish subscription request for a new list; the path of its confirmation link."""
    with engine.begin() as conn:
        list_id = int(lists.create_list(conn, "Noticias")["id"])
        subscriptions.save_form(conn, list_id, enabled=True, title="", intro="",
                                accent="#aa3300", actor="t")
    form = client.get(f"/subscribe/{list_id}?lang=es").get_data(as_text=True)
    token = re.search(r'name="form_token" value="([^"]+)"', form)
    assert token, form
    r = client.post(f"/subscribe/{list_id}?lang=es", data={
        "form_token": token[1], "email": "ana@example.org", "lang": "es"})
    assert r.status_code == 200, r.get_data(as_text=True)
    with engine.connect() as conn:
        url = conn.execute(sa.text(
            "SELECT payload->'data'->>'confirm_url' FROM delivery_jobs "
            "WHERE kind = 'subscription_confirmation'")).scalar_one()
    return str(url).removeprefix("http://127.0.0.1:5000")


def test_an_expired_confirmation_link_speaks_the_requesters_language(
        client: Any, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _spanish_request(client, engine)
    monkeypatch.setattr(subscriptions, "CONFIRM_MAX_AGE", -1)  # every link is now too old
    english = {"Accept-Language": "en-GB,en;q=0.9"}  # the browser is English; she chose Spanish
    for answer in (client.get(path, headers=english), client.post(path, headers=english)):
        page = answer.get_data(as_text=True)
        assert answer.status_code == 404, page
        assert 'lang="es"' in page and "ha caducado" in page, page
        assert "has expired" not in page
        _public(page)


def test_a_forged_confirmation_link_follows_the_browsers_language(client: Any) -> None:
    forged = subscriptions.confirm_token("another-secret", 1)
    page = client.get(f"/subscribe/confirm/{forged}",
                      headers={"Accept-Language": "es-ES,es;q=0.9"}).get_data(as_text=True)
    assert 'lang="es"' in page and "ha caducado" in page, page
    _public(page)
    page = client.get(f"/subscribe/confirm/{forged}",
                      headers={"Accept-Language": "en"}).get_data(as_text=True)
    assert 'lang="en"' in page and "has expired" in page, page


def test_public_pages_show_no_admin_navigation_even_when_logged_in(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    campaign = make_campaign(engine, ["reader@example.org"], name="Weekly", send=False)
    with engine.connect() as conn:
        reader = int(conn.execute(sa.text(
            "SELECT id FROM subscribers WHERE email = 'reader@example.org'")).scalar_one())
    Browser(client, make_user("admin"))  # the admin opens the links from their own inbox
    assert 'class="mainnav"' in client.get("/").get_data(as_text=True)  # the admin layout
    pages = {
        "/u/" + make_token(SECRET, reader, campaign["id"]): 200,  # preference page
        "/u/garbage": 404,                                       # a broken unsubscribe link
        "/r/garbage": 404,                                       # a broken tracking link
        "/archive/garbage": 404,                                 # no such web version
        "/archive/list/garbage": 404,
        "/subscribe/confirm/garbage": 404,                       # a broken confirmation link
    }
    for path, status in pages.items():
        r = client.get(path)
        assert r.status_code == status, (path, r.status_code)
        _public(r.get_data(as_text=True))


def test_a_visitors_404_uses_the_public_layout_in_their_language(client: Any) -> None:
    r = client.get("/no/such/page", headers={"Accept-Language": "es"})
    page = r.get_data(as_text=True)
    assert r.status_code == 404 and 'lang="es"' in page, page
    _public(page)


def test_a_logged_in_users_404_keeps_the_admin_layout(
        client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    Browser(client, make_user("marketer"))
    page = client.get("/no/such/page").get_data(as_text=True)
    assert 'class="mainnav"' in page and "Back to the dashboard" in page
