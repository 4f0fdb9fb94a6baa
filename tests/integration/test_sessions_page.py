"""A person sees their sessions and ends them (docs/security.md, sessions): the account
page lists every browser signed in as them (browser, address, signed in, last seen, this
one marked), in English and Spanish; ending one signs that browser out at its next
request; "End all other sessions" keeps only this one; both are audited; a handle of
another user's session ends nothing."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser
from webapp.domain import users

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
          "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1")


def _browser(app: Any, user: dict[str, Any], agent: str) -> Browser:
    client = app.test_client()
    client.environ_base["HTTP_USER_AGENT"] = agent
    return Browser(client, user)


def _handles(page: str) -> list[str]:
    return re.findall(r'data-session="([0-9a-f]{16})"', page)


def test_sessions_listed_and_ended(app: Any, engine: sa.Engine,
                                   make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    laptop = _browser(app, user, FIREFOX)
    phone = _browser(app, user, IPHONE)
    third = _browser(app, user, "curl/8.5.0")
    page = html.unescape(laptop.get("/account/").get_data(as_text=True))
    assert "Your sessions" in page
    assert "Firefox · Linux" in page and "Safari · iOS" in page and "curl" in page
    rows = page.split('id="session-list"', 1)[1]
    assert rows.index("this session") < rows.index("Safari · iOS")  # this one first
    handles = _handles(page)
    assert len(handles) == 3
    spanish = html.unescape(laptop.get("/account/", headers={"Accept-Language": "es"})
                            .get_data(as_text=True))
    assert "Tus sesiones" in spanish and "esta sesión" in spanish
    # End the phone's session: the phone is signed out at its next request.
    phone_handle = _handles(html.unescape(phone.get("/account/").get_data(as_text=True)))[0]
    assert phone_handle in handles
    done = laptop.post(f"/account/sessions/{phone_handle}/end")
    assert "That session has ended" in html.unescape(done.get_data(as_text=True))
    assert phone.get("/account/").status_code == 302  # to the login page
    assert third.get("/account/").status_code == 200
    # End all the others: only the laptop stays signed in.
    done = laptop.post("/account/sessions/end-others")
    assert "1 other session ended." in done.get_data(as_text=True)
    assert third.get("/account/").status_code == 302
    assert laptop.get("/account/").status_code == 200
    # Another user's session cannot be ended by its handle.
    other = make_user("support")
    theirs = _browser(app, other, FIREFOX)
    their_handle = _handles(theirs.get("/account/").get_data(as_text=True))[0]
    gone = laptop.post(f"/account/sessions/{their_handle}/end")
    assert "That session had already ended." in html.unescape(gone.get_data(as_text=True))
    assert theirs.get("/account/").status_code == 200
    with engine.connect() as conn:
        actions = conn.execute(sa.text(
            "SELECT action FROM audit_log WHERE action LIKE 'session.%' ORDER BY id"
        )).scalars().all()
    assert actions == ["session.end", "session.end_others"]


def test_last_seen_moves_at_most_once_a_minute(engine: sa.Engine,
                                               make_user: Callable[..., dict[str, Any]]
                                               ) -> None:
    user = make_user("support")
    with engine.begin() as conn:
        token = users.start_session(conn, int(user["id"]), user_agent=FIREFOX,
                                    address="192.0.2.7")
        users.seen(conn, token, "192.0.2.8")  # just started: nothing changes
        [row] = users.list_sessions(conn, int(user["id"]), token)
        assert row["address"] == "192.0.2.7" and row["current"]
        conn.execute(sa.text("UPDATE web_sessions SET last_seen_at = now() - "
                             "interval '2 minutes'"))
        users.seen(conn, token, "192.0.2.8")
        [row] = users.list_sessions(conn, int(user["id"]), token)
        assert row["address"] == "192.0.2.8"
    assert users.browser_of(FIREFOX) == "Firefox · Linux"
    assert users.browser_of(IPHONE) == "Safari · iOS"
    assert users.browser_of("") == ""


def test_an_admin_sees_and_ends_a_users_sessions(app: Any, engine: sa.Engine,
                                                 make_user: Callable[..., dict[str, Any]]
                                                 ) -> None:
    admin = _browser(app, make_user("admin"), FIREFOX)
    user = make_user("marketer")
    phone = _browser(app, user, IPHONE)
    page = html.unescape(admin.get("/admin/users").get_data(as_text=True))
    row = page.split(f'id="sessions-{user["id"]}"', 1)[1].split("</details>", 1)[0]
    assert "1 session" in row and "Safari · iOS" in row
    spanish = html.unescape(admin.get("/admin/users", headers={"Accept-Language": "es"})
                            .get_data(as_text=True))
    assert "Cerrar sus sesiones" in spanish
    done = admin.post(f"/admin/users/{user['id']}/sessions/end")
    assert "Their sessions ended" in html.unescape(done.get_data(as_text=True))
    assert phone.get("/account/").status_code == 302
    assert admin.get("/account/").status_code == 200
    marketer = _browser(app, make_user("marketer"), FIREFOX)
    assert marketer.post(f"/admin/users/{user['id']}/sessions/end",
                         follow_redirects=False).status_code == 403
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM audit_log WHERE action = 'session.end_all'")).scalar() == 1
