"""A refused form comes back as it was filled in, with why in the page's language (issue
29): add subscriber, schedule in the past, duplicate user, bad webhook URL, invalid domain.
And the smaller promises of the same walk: "Create token" is POST/redirect/GET (a reload
creates no second token), the webhook "Kinds" filter offers the admins' kinds."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import Browser, make_campaign
from tests.integration.test_spanish_pages import english_in

LANGS = {"en": {}, "es": {"Accept-Language": "es"}}


def _post(browser: Browser, path: str, data: dict[str, Any], lang: str) -> str:
    answer = browser.client.post(path, data={**data, "csrf_token": browser.token},
                                 headers=LANGS[lang], follow_redirects=True)
    assert answer.status_code in (200, 422), answer.status_code
    return answer.get_data(as_text=True)


def _value(page: str, name: str) -> str:
    found = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', page) or \
        re.search(rf'<input[^>]*value="([^"]*)"[^>]*name="{name}"', page)
    return unescape(found[1]) if found else ""


def _flash(page: str) -> str:
    found = re.findall(r'<div class="flash flash-error"[^>]*>(.*?)</div>', page, re.S)
    assert found, "no error shown"
    return " ".join(unescape(re.sub(r"<[^>]+>", "", f)) for f in found)


def _said_in(lang: str, page: str, english: str, spanish: str) -> None:
    flash = _flash(page)
    assert (english if lang == "en" else spanish) in flash, flash
    if lang == "es":
        assert not english_in(page), english_in(page)


def _draft(app: Any, engine: sa.Engine, make_user: Any) -> tuple[dict[str, Any], Browser]:
    """A draft campaign and its list, and a marketer's browser."""
    campaign = make_campaign(engine, ["a@example.org"], send=False)
    return campaign, Browser(app.test_client(), make_user("marketer"))


@pytest.mark.parametrize("lang", LANGS)
def test_add_subscriber_keeps_its_input(app: Any, engine: sa.Engine, make_user: Any,
                                        lang: str) -> None:
    campaign, browser = _draft(app, engine, make_user)
    page = _post(browser, f"/lists/{campaign['list_id']}/subscribers",
                 {"email": "ana.example.org", "name": "Ana García",
                  "attributes": "plan: pro\ncity: Lyon"}, lang)
    _said_in(lang, page, "An email address must have an @-sign.",
             "Una dirección de correo debe tener una @.")
    assert _value(page, "email") == "ana.example.org" and _value(page, "name") == "Ana García"
    assert "plan: pro\ncity: Lyon</textarea>" in page
    again = browser.get(f"/lists/{campaign['list_id']}").get_data(as_text=True)
    assert _value(again, "email") == ""  # kept for the one page after the refusal only


@pytest.mark.parametrize("lang", LANGS)
def test_a_schedule_in_the_past_keeps_its_time(app: Any, engine: sa.Engine, make_user: Any,
                                               lang: str) -> None:
    campaign, browser = _draft(app, engine, make_user)
    page = _post(browser, f"/campaigns/{campaign['id']}/send",
                 {"when": "later", "at": "2020-05-01T09:30", "tz_offset": "0"}, lang)
    _said_in(lang, page, "the time to send at has already passed",
             "la hora de envío ya ha pasado")
    assert _value(page, "at") == "2020-05-01T09:30"


@pytest.mark.parametrize("lang", LANGS)
def test_a_duplicate_user_keeps_the_form_but_never_the_password(
        app: Any, make_user: Any, lang: str) -> None:
    admin = make_user("admin")
    browser = Browser(app.test_client(), admin)
    page = _post(browser, "/admin/users/create", {"email": admin["email"], "role": "support",
                                                  "password": "a long password 123"}, lang)
    assert _value(page, "email") == admin["email"]
    form = page[page.index('action="/admin/users/create"'):]
    form = form[:form.index("</form>")]
    assert '<option value="support" selected>' in form
    assert "a long password 123" not in page
    if lang == "es":
        assert not english_in(page), english_in(page)


@pytest.mark.parametrize("lang", LANGS)
def test_a_bad_webhook_url_keeps_the_form(app: Any, engine: sa.Engine, make_user: Any,
                                          lang: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO kinds (name, class, subject, text_body) VALUES "
                             "('onboarding', 'lifecycle', 'Hi', 'Welcome')"))
    browser = Browser(app.test_client(), make_user("admin"))
    page = _post(browser, "/admin/event-webhooks/", {
        "url": "ftp://hooks.example.com/x", "description": "CRM",
        "events": ["bounced", "complained"], "kinds": ["onboarding"]}, lang)
    _said_in(lang, page, "The URL must be an http:// or https:// address.",
             "La URL debe ser una dirección http:// o https://.")
    assert _value(page, "url") == "ftp://hooks.example.com/x"
    assert _value(page, "description") == "CRM"
    checked = re.findall(r'name="(events|kinds)" value="(\w+)" checked', page)
    assert sorted(checked) == [("events", "bounced"), ("events", "complained"),
                               ("kinds", "onboarding")]  # the admin's kind is offered


@pytest.mark.parametrize("lang", LANGS)
def test_an_invalid_domain_keeps_the_form(app: Any, make_user: Any, lang: str) -> None:
    browser = Browser(app.test_client(), make_user("admin"))
    page = _post(browser, "/admin/domains/keys", {"domain": "not a domain!", "algorithm": "ed25519",
                                            "selector": "s2026"}, lang)
    assert _value(page, "domain") == "not a domain!" and _value(page, "selector") == "s2026"
    assert '<option value="ed25519" selected>' in page
    _flash(page)
    if lang == "es":
        assert not english_in(page), english_in(page)


def test_reloading_after_create_token_creates_no_second_token(
        app: Any, engine: sa.Engine, make_user: Any) -> None:
    admin = make_user("admin")
    browser = Browser(app.test_client(), admin)
    answer = browser.client.post("/admin/tokens/create", data={
        "csrf_token": browser.token, "user_id": str(admin["id"]), "name": "ci",
        "expires": "30", "scopes": ["send", "admin"]})
    assert answer.status_code == 303 and answer.location.endswith("/admin/users")
    shown = browser.get("/admin/users").get_data(as_text=True)
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', shown)
    assert token, "the new token is shown once after the redirect"
    assert token[1] not in answer.headers.get("Set-Cookie", "")  # sealed, not readable
    reloaded = browser.get("/admin/users").get_data(as_text=True)
    assert 'id="new-token"' not in reloaded  # shown once; a reload shows (and makes) none
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM api_tokens WHERE name = 'ci'")
                            ).scalar() == 1
