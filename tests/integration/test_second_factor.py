"""Two-factor authentication through the real pages: enrol with the QR
code's secret and a code computed here with pyotp, log in with a code, replay refused,
recovery codes single-use, attempts limited, roles that require it, an admin's reset
(audited) and the step-up before sensitive actions."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pyotp
import pytest
import sqlalchemy as sa

from tests.helpers import Browser
from tests.integration.security_fixtures import csrf_token

CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


def _csrf(client: Any) -> str:
    found = CSRF.search(client.get("/account/").get_data(as_text=True))
    assert found
    return found[1]


def _enrol(app: Any, user: dict[str, Any]) -> tuple[Browser, pyotp.TOTP, list[str]]:
    browser = Browser(app.test_client(), user)
    page = browser.get("/account/second-factor").get_data(as_text=True)
    assert "<svg" in page and "QR code" in page
    secret = re.search(r'<code id="totp-secret">([A-Z2-7]+)</code>', page)
    assert secret
    # A reload shows the same secret (kept sealed in the session until confirmed).
    again = browser.get("/account/second-factor").get_data(as_text=True)
    assert secret[1] in again
    totp = pyotp.TOTP(secret[1])
    wrong = browser.post("/account/second-factor/enrol", {"code": "000000"
                                                          if totp.now() != "000000"
                                                          else "111111"})
    assert wrong.status_code == 422 and "not turned on" in wrong.get_data(as_text=True)
    done = browser.post("/account/second-factor/enrol", {"code": totp.now()})
    assert done.status_code == 200, done.get_data(as_text=True)[:2000]
    html = done.get_data(as_text=True)
    assert done.headers["Cache-Control"] == "no-store"
    codes = re.search(r'<pre id="recovery-codes">([^<]+)</pre>', html)
    assert codes
    # Enrolling ended the other sessions and renewed this one (a new CSRF token).
    browser.token = _csrf(browser.client)
    return browser, totp, codes[1].split()


def _password_step(client: Any, user: dict[str, Any], next_url: str = "") -> Any:
    token = csrf_token(client)
    path = f"/login?next={next_url}" if next_url else "/login"
    return client.post(path, data={"email": user["email"], "password": user["password"],
                                   "csrf_token": token})


def _code_step(client: Any, code: str) -> Any:
    page = client.get("/login/second-factor").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token, page[:500]
    return client.post("/login/second-factor", data={"code": code, "csrf_token": token[1]})


def _next_code(totp: pyotp.TOTP) -> str:
    """A code for the next time step (accepted once: one step of drift is allowed)."""
    return totp.at(time.time() + 30)


def test_enrol_then_login_needs_a_code_and_a_replay_is_refused(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    _, totp, codes = _enrol(app, user)
    assert len(codes) == 10 and len(set(codes)) == 10
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT totp_secret FROM users WHERE id = :i"),
                           {"i": user["id"]}).scalar_one()
        hashes = conn.execute(sa.text("SELECT code_hash FROM recovery_codes WHERE "
                                      "user_id = :i"), {"i": user["id"]}).scalars().all()
    assert totp.secret not in row  # sealed
    assert len(hashes) == 10 and not set(codes) & set(hashes)

    client = app.test_client()
    answer = _password_step(client, user, "/lists/")
    assert answer.status_code == 303 and answer.location.endswith("/login/second-factor")
    assert client.get("/lists/").status_code == 302  # not logged in yet
    wrong = _code_step(client, "12345")
    assert wrong.status_code == 401 and "wrong code" in wrong.get_data(as_text=True)
    code = _next_code(totp)
    ok = _code_step(client, code)
    assert ok.status_code == 302 and ok.location.endswith("/lists/")
    assert client.get("/lists/").status_code == 200

    # The same code again (another login) is refused: its time step was used.
    other = app.test_client()
    _password_step(other, user)
    replay = _code_step(other, code)
    assert replay.status_code == 401 and "used already" in replay.get_data(as_text=True)
    # A recovery code works once.
    assert _code_step(other, codes[0].lower()).status_code == 302
    third = app.test_client()
    _password_step(third, user)
    assert _code_step(third, codes[0]).status_code == 401
    with engine.connect() as conn:
        actions = conn.execute(sa.text(
            "SELECT action FROM audit_log WHERE target = :t ORDER BY id"),
            {"t": f"user:{user['id']}"}).scalars().all()
    assert "user.second_factor_enrol" in actions and "user.recovery_code_used" in actions


def test_wrong_codes_are_limited_like_passwords(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("support")
    _, totp, _codes = _enrol(app, user)
    client = app.test_client()
    _password_step(client, user)
    statuses = [_code_step(client, "999999" if totp.now() != "999999" else "888888"
                           ).status_code for _ in range(5)]
    assert statuses.count(401) >= 4  # the password step itself counted one success
    locked = _code_step(client, _next_code(totp))
    assert locked.status_code == 429 and "Too many" in locked.get_data(as_text=True)


def test_a_role_that_requires_it_sends_the_user_to_enrolment(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(app.test_client(), make_user("admin"))
    saved = admin.post("/admin/users/second-factor-roles", {"roles": ["support"]})
    assert "must use a second factor" in saved.get_data(as_text=True)
    support = make_user("support")
    client = app.test_client()
    login = _password_step(client, support, "/support/")
    assert login.status_code == 302 and login.location.endswith("/account/second-factor")
    browser = Browser(app.test_client(), support)
    for path in ("/", "/support/"):
        answer = browser.get(path)
        assert answer.status_code == 302 and answer.location.endswith(
            "/account/second-factor"), path
    page = browser.get("/account/second-factor").get_data(as_text=True)
    assert "Your role requires a second factor" in page
    secret = re.search(r'<code id="totp-secret">([A-Z2-7]+)</code>', page)
    assert secret
    browser.post("/account/second-factor/enrol", {"code": pyotp.TOTP(secret[1]).now()})
    assert browser.get("/support/").status_code == 200
    bad = admin.post("/admin/users/second-factor-roles", {"roles": ["root"]})
    assert "role must be one of" in bad.get_data(as_text=True)


def test_an_admin_resets_a_lost_second_factor(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    theirs, _totp, _codes = _enrol(app, user)
    admin_user = make_user("admin")
    admin = Browser(app.test_client(), admin_user)
    listing = admin.get("/admin/users").get_data(as_text=True)
    assert f'id="reset-2fa-{user["id"]}"' in listing
    done = admin.post(f"/admin/users/{user['id']}/second-factor/reset")
    assert "Second factor reset" in done.get_data(as_text=True)
    assert theirs.get("/lists/").status_code == 302  # their sessions ended
    client = app.test_client()
    assert _password_step(client, user).status_code == 302  # no second step any more
    with engine.connect() as conn:
        entry = conn.execute(sa.text(
            "SELECT actor FROM audit_log WHERE action = 'user.second_factor_reset' "
            "AND target = :t"), {"t": f"user:{user['id']}"}).scalar_one()
        assert entry == admin_user["email"]
        assert conn.execute(sa.text("SELECT count(*) FROM recovery_codes WHERE user_id = :u"),
                            {"u": user["id"]}).scalar_one() == 0
    again = admin.post(f"/admin/users/{user['id']}/second-factor/reset")
    assert "no second factor to reset" in again.get_data(as_text=True)


@pytest.mark.parametrize("language", ["en", "es"])
def test_step_up_before_a_sensitive_action_when_the_check_is_old(
        language: str, app: Any, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    admin_user = make_user("admin")
    browser, totp, _codes = _enrol(app, admin_user)
    if language == "es":
        browser.post("/account/language", {"locale": "es"})
    # Freshly enrolled: the session passed the check just now, no step-up.
    marketer = make_user("marketer")
    fresh = browser.post("/admin/tokens/create", {"user_id": str(marketer["id"]),
                                                  "name": "fresh", "expires": "30",
                                                  "scopes": ["campaigns"]})
    assert 'id="new-token"' in fresh.get_data(as_text=True)
    # The check is older than SENDDOCK_STEP_UP_MINUTES: asked again.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE web_sessions SET second_factor_at = now() - "
                             "interval '1 hour' WHERE user_id = :u"), {"u": admin_user["id"]})
    asked = browser.client.post("/admin/tokens/create", data={
        "csrf_token": browser.token, "user_id": str(marketer["id"]), "name": "stale",
        "expires": "30", "scopes": ["campaigns"]},
        headers={"Referer": "http://localhost/admin/users"})
    assert asked.status_code == 303 and "/account/step-up" in asked.location
    page = browser.get(asked.location).get_data(as_text=True)
    assert ("Confirm it is you" if language == "en" else "Confirma que eres tú") in page
    export = browser.get("/lists/1/export.csv")
    assert export.status_code == 303 and "/account/step-up" in export.location
    role = browser.client.post(f"/admin/users/{marketer['id']}/role", data={
        "csrf_token": browser.token, "role": "support"})
    assert role.status_code == 303 and "/account/step-up" in role.location
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT role FROM users WHERE id = :u"),
                            {"u": marketer["id"]}).scalar_one() == "marketer"
        assert conn.execute(sa.text("SELECT count(*) FROM api_tokens WHERE name = 'stale'")
                            ).scalar_one() == 0
    wrong = browser.post(asked.location, {"code": "abc"}, follow_redirects=False)
    assert wrong.status_code == 422
    ok = browser.post(asked.location, {"code": _next_code(totp)}, follow_redirects=False)
    assert ok.status_code == 303 and ok.location.endswith("/admin/users")
    # The form comes back filled in; now it goes through.
    back = browser.get("/admin/users").get_data(as_text=True)
    assert 'value="stale"' in back
    done = browser.post("/admin/tokens/create", {"user_id": str(marketer["id"]),
                                                 "name": "stale", "expires": "30",
                                                 "scopes": ["campaigns"]})
    assert 'id="new-token"' in done.get_data(as_text=True)
