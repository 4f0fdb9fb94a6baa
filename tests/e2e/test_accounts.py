"""Accounts in a real browser, in English and Spanish (docs/security.md): an admin turns
two-factor on by typing a code computed here from the key the page shows, keeps the
recovery codes, logs out and back in with a code, sees a replayed code refused and a
recovery code work once; sees their sessions and ends the other browser's; creates a
send-only token on the Users & tokens page and sees the API take a message with it and
refuse everything else."""

from __future__ import annotations

import re
import time
from typing import Any

import pyotp
import pytest
import requests
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer
from webapp.domain import users

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PASSWORD = "accounts-journey-1"
WORDS = {
    "en": {"enrol": "Turn on two-factor", "sessions": "Your sessions", "this": "this session",
           "refused": "code", "ended": "That session has ended"},
    "es": {"enrol": "Activar", "sessions": "Tus sesiones", "this": "esta sesión",
           "refused": "código", "ended": "Esa sesión se ha cerrado"},
}


def _password(page: Any, server: LiveServer, email: str) -> None:
    page.goto(f"{server.url}/login")
    page.fill("input[name=email]", email)
    with page.expect_navigation():
        page.locator("input[name=password]").fill(PASSWORD)
        page.locator("input[name=password]").press("Enter")


def _code(page: Any, code: str) -> None:
    field = page.locator("main input[name=code]")
    field.fill(code)
    with page.expect_navigation():
        field.press("Enter")


def _fresh_code(totp: pyotp.TOTP, used: set[str]) -> str:
    """A code not used before (a used one is refused on replay): this step's, or the next
    step's once this one is spent (one step of drift is accepted)."""
    for when in (time.time(), time.time() + 30):
        code = totp.at(when)
        if code not in used:
            used.add(code)
            return code
    raise AssertionError("no fresh code")


@pytest.mark.parametrize("language", ["en", "es"])
def test_two_factor_sessions_and_a_send_only_token(browser: Any, live_server: LiveServer,
                                                   engine: sa.Engine, language: str) -> None:
    words = WORDS[language]
    email = f"admin-{language}@example.com"
    with engine.begin() as conn:
        user = users.create_user(conn, email, PASSWORD, "admin")
        users.set_locale(conn, int(user["id"]), language, allowed=("en", "es"), actor="test")
    # A Spanish speaker's browser asks for Spanish (the pages before the login is complete
    # follow the browser; after it, the saved language).
    locale = "es-ES" if language == "es" else "en-US"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=locale)
    page = context.new_page()
    _password(page, live_server, email)
    page.goto(f"{live_server.url}/account/second-factor")
    secret = page.inner_text("#totp-secret").strip()
    assert page.locator(".qr svg").count() == 1
    totp = pyotp.TOTP(secret)
    used: set[str] = set()
    _code(page, _fresh_code(totp, used))
    codes = page.inner_text("#recovery-codes").split()
    assert len(codes) == 10
    # Log out, then in: the password alone is not enough.
    page.goto(f"{live_server.url}/account/")
    page.locator("form[action$='/logout'] button").first.click()
    page.wait_for_load_state("load")
    _password(page, live_server, email)
    assert page.url.endswith("/login/second-factor")
    replay = next(iter(used))
    _code(page, replay)
    assert page.url.endswith("/login/second-factor")  # a used code is refused
    assert words["refused"] in page.inner_text("main").lower()
    _code(page, _fresh_code(totp, used))
    assert not page.url.endswith("/login/second-factor")
    # A second browser signs in with a recovery code (once).
    other = browser.new_context(locale=locale).new_page()
    _password(other, live_server, email)
    _code(other, codes[0])
    assert not other.url.endswith("/login/second-factor")
    # Sessions: two browsers; end the other one.
    page.goto(f"{live_server.url}/account/")
    assert words["sessions"] in page.inner_text("#sessions")
    rows = page.locator("#session-list tbody tr")
    assert rows.count() == 2
    assert words["this"] in rows.nth(0).inner_text()
    rows.nth(1).locator("button").click()
    page.wait_for_load_state("load")
    assert words["ended"] in page.inner_text("main")
    other.goto(f"{live_server.url}/account/")
    assert "/login" in other.url
    # The used recovery code does not work twice.
    _password(other, live_server, email)
    _code(other, codes[0])
    assert other.url.endswith("/login/second-factor")
    # A send-only token: the API takes a message with it and refuses the rest.
    page.goto(f"{live_server.url}/admin/users")
    form = page.locator("form[action$='/admin/tokens/create']")
    form.locator("input[name=name]").fill("signup service")
    form.locator("input[name=scopes][value=send]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_load_state("load")
    if page.url.endswith("/account/step-up") or page.locator("input[name=code]").count():
        _code(page, _fresh_code(totp, used))
        page.goto(f"{live_server.url}/admin/users")
        form = page.locator("form[action$='/admin/tokens/create']")
        form.locator("input[name=name]").fill("signup service")
        form.locator("input[name=scopes][value=send]").check()
        form.locator("button[type=submit]").click()
        page.wait_for_load_state("load")
    token = page.inner_text("#new-token").strip()
    assert re.fullmatch(r"sd_\S+", token), token
    headers = {"Authorization": f"Bearer {token}"}
    sent = requests.post(f"{live_server.url}/api/v1/messages", headers=headers, timeout=30,
                         json={"kind": "verification", "user_id": f"u-{language}",
                               "email": f"u-{language}@example.org",
                               "data": {"verify_url": "https://app.example/v?t=1"}})
    assert sent.status_code == 202, sent.text
    for path in ("/lists", "/suppressions", "/warmups"):
        refused = requests.get(f"{live_server.url}/api/v1{path}", headers=headers,
                               timeout=30)
        assert refused.status_code == 403, (path, refused.text)
    context.close()
