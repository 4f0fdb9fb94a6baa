"""Users look after themselves and admins after them: an own password change, an
admin reset, token expiry and a copy button, logins and failed logins in a readable audit
log, support search by part of an address, and pages of jobs on their way that refresh."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, enqueue_verification, place_jobs
from webapp.domain import users


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def _login(app: Any, email: str, password: str) -> int:
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"',
                      client.get("/login").get_data(as_text=True))[1]
    return int(client.post("/login", data={"email": email, "password": password,
                                            "csrf_token": token}).status_code)


def test_a_user_changes_their_own_password(app: Any,
                                           make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("support")
    me, other = Browser(app.test_client(), user), Browser(app.test_client(), user)
    wrong = me.post("/account/password", {"current": "nope", "password": "a new long one!",
                                           "confirm": "a new long one!"})
    assert wrong.status_code == 422 and "current password is not that one" in \
        wrong.get_data(as_text=True)
    differ = me.post("/account/password", {"current": user["password"],
                                            "password": "a new long one!", "confirm": "x"})
    assert "differ" in differ.get_data(as_text=True)
    done = me.post("/account/password", {"current": user["password"],
                                          "password": "a new long one!",
                                          "confirm": "a new long one!"})
    assert "Password changed" in done.get_data(as_text=True)
    assert me.get("/").status_code == 200  # this session goes on
    assert other.get("/").status_code == 302  # the other one ended
    assert _login(app, user["email"], user["password"]) == 401
    assert _login(app, user["email"], "a new long one!") == 302


def test_an_admin_resets_a_password_and_tokens_expire(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    admin, marketer = make_user("admin"), make_user("marketer")
    theirs = Browser(app.test_client(), marketer)
    browser = Browser(app.test_client(), admin)
    r = browser.post(f"/admin/users/{marketer['id']}/password", {"password": "reset by admin"})
    assert "Password reset" in r.get_data(as_text=True)
    assert theirs.get("/").status_code == 302
    assert _login(app, marketer["email"], "reset by admin") == 302
    created = browser.post("/admin/tokens/create", {"user_id": str(marketer["id"]),
                                                     "name": "ci", "expires": "30",
                                                     "scopes": ["campaigns"]})
    page = created.get_data(as_text=True)
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', page)[1]
    assert 'data-copy="#new-token"' in page and "<script>" not in page
    api = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    assert api.get("/api/v1/lists", headers=headers).status_code == 200
    listing = _text(browser.get("/admin/users").get_data(as_text=True))
    assert re.search(r"ci marketer-\S+ marketer \S+ \S+ \d{4}-\d\d-\d\d \d{4}-\d\d-\d\d", listing)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE api_tokens SET expires_at = now() - interval '1 s' "
                             "WHERE name = 'ci'"))
    users.forget_tokens()  # the expiry was moved behind the process's back
    assert api.get("/api/v1/lists", headers=headers).status_code == 401
    assert "expired" in _text(browser.get("/admin/users").get_data(as_text=True))


def test_logins_and_failed_logins_are_in_a_readable_audit_log(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = make_user("admin")
    assert _login(app, "nobody@example.org", "guess guess guess") == 401
    browser = Browser(app.test_client(), admin)
    failed = _text(browser.get("/admin/audit?action=user.login_failed").get_data(
        as_text=True))
    assert "user.login_failed nobody@example.org" in failed
    assert "wrong email or password" in failed and "IP address 127.0.0.1" in failed
    spanish = _text(browser.get("/admin/audit?action=user.login_failed",
                                headers={"Accept-Language": "es"}).get_data(as_text=True))
    assert "motivo wrong email or password dirección IP 127.0.0.1" in spanish  # keys in Spanish
    logins = _text(browser.get("/admin/audit?action=user.login").get_data(as_text=True))
    assert f"{admin['email']} user.login user:{admin['id']}" in logins
    browser.post("/inbox/retry-all", {"kind": "verification", "as_of": "2030-01-01T00:00:00"})
    entry = _text(browser.get("/admin/audit?action=job.").get_data(as_text=True))
    assert "filters kind = verification" in entry and "{" not in entry.split("job.retry_all")[1]


def test_support_finds_users_by_part_of_an_address(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        for email, ref in (("alice.smith@example.com", "u-100"), ("bob@example.com", "u-200"),
                           ("carol@other.org", "u-300")):
            enqueue_verification(conn, email, ref)
    browser = Browser(client, make_user("support"))
    one = browser.get("/support/?q=smith")
    assert one.status_code == 302 and one.location.endswith("/support/users/u-100")
    many = _text(browser.get("/support/?q=@example.com").get_data(as_text=True))
    assert "2 users match" in many and "u-100" in many and "u-200" in many
    assert "u-300" not in many
    assert browser.get("/support/?q=u-3").status_code == 302  # start of a user id


def test_a_job_on_its_way_refreshes_itself(client: Any, engine: sa.Engine,
                                           make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        job_id = enqueue_verification(conn, "a@example.org", "u-1")
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'retry' WHERE id = :j"),
                     {"j": job_id})
    admin = Browser(client, make_user("admin"))
    page = admin.get(f"/inbox/{job_id}").get_data(as_text=True)
    assert 'hx-select="#job-live" hx-trigger="every 3s' in page
    support = Browser(client, make_user("support"))
    user_page = support.get("/support/users/u-1").get_data(as_text=True)
    assert 'hx-trigger="every 2s' in user_page


def test_the_audit_filters_are_bounded(client: Any,
                                       make_user: Callable[..., dict[str, Any]]) -> None:
    """A 60,000-character actor pattern held a request thread for 2.7 s (an ILIKE over the
    whole log): a filter longer than an address is refused, naming the bound."""
    browser = Browser(client, make_user("admin"))
    long = browser.get("/admin/audit?actor=" + "a" * 60_000)
    assert long.status_code == 422 and "at most 320 characters" in long.get_data(as_text=True)
    assert browser.get("/admin/audit?actor=admin").status_code == 200
