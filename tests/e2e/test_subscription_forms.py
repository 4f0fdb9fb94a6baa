"""Double opt-in in a real browser, in English and Spanish: a marketer
turns the list's form on and sees its link and embed snippet; a visitor subscribes; the
confirmation email reaches the test SMTP sink; its link is followed and confirmed; the
address is then on the list, active."""

from __future__ import annotations

import email
import email.policy
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from webapp.domain import lists

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"save": "Save form", "subscribe": "Subscribe", "done": "check your inbox",
           "subject": "Confirm your subscription to Garden club", "yes": "Yes, subscribe me",
           "subscribed": "You are subscribed"},
    "es": {"save": "Guardar formulario", "subscribe": "Suscribirme",
           "done": "revisa tu correo", "subject": "Confirma tu suscripción a Garden club",
           "yes": "Sí, suscribirme", "subscribed": "Ya estás suscrito"},
}


def _confirmation(sink: Any, address: str) -> email.message.EmailMessage | None:
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        if address in str(message["To"]):
            return message
    return None


def _members(engine: sa.Engine, list_id: int) -> dict[str, str]:
    with engine.connect() as conn:
        return {r.email: r.status for r in conn.execute(sa.text(
            "SELECT s.email, s.status FROM memberships m JOIN subscribers s "
            "ON s.id = m.subscriber_id WHERE m.list_id = :l"), {"l": list_id})}


@pytest.mark.parametrize("lang", ["en", "es"])
def test_a_visitor_subscribes_and_confirms(browser: Any, live_server: LiveServer,
                                          engine: sa.Engine, sink: Any, lang: str,
                                          make_user: Callable[..., dict[str, Any]]) -> None:
    words = WORDS[lang]
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Garden club")["id"]
    marketer = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang})
    page = marketer.new_page()
    login(page, live_server, make_user("marketer"))
    page.goto(f"{live_server.url}/lists/{list_id}")
    section = page.locator("#subscription-form")
    section.locator("input[name=enabled]").check()
    section.locator("input[name=title]").fill("Garden club news")
    section.locator("textarea[name=intro]").fill("Seeds, tips and meetups.")
    section.get_by_role("button", name=words["save"]).click()
    link = page.locator("#form-link")
    expect(link).to_have_text(f"{live_server.url}/subscribe/{list_id}")
    expect(page.locator("#embed-snippet")).to_have_value(re.compile(
        rf'^<iframe src="{re.escape(live_server.url)}/subscribe/{list_id}"'))
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"list-subscription-form-{lang}.png"), full_page=True)
    form_url = link.get_attribute("href")
    marketer.close()

    visitor = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang})
    errors: list[str] = []
    page = visitor.new_page()
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{live_server.url}{form_url}")
    expect(page.locator("h1")).to_have_text("Garden club news")
    expect(page.locator(".intro")).to_have_text("Seeds, tips and meetups.")
    address = f"visitor-{lang}@example.org"
    page.fill("input[name=email]", address)
    page.fill("input[name=name]", "Vera")
    page.get_by_role("button", name=words["subscribe"], exact=True).click()
    expect(page.locator("#subscribe-done")).to_contain_text(words["done"])
    page.screenshot(path=str(ARTIFACTS / f"subscribe-done-{lang}.png"), full_page=True)
    assert _members(engine, list_id) == {}  # pending until confirmed

    message = wait_for(lambda: _confirmation(sink, address), timeout=60,
                       message="the confirmation email in the sink")
    assert message["Subject"] == words["subject"]
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    found = re.search(r"http://\S+/subscribe/confirm/\S+", body.get_content())
    assert found, body.get_content()
    page.goto(found[0])
    page.get_by_role("button", name=words["yes"]).click()
    expect(page.locator("h1")).to_have_text(words["subscribed"])
    expect(page.locator("#confirmed")).to_contain_text(address)
    page.screenshot(path=str(ARTIFACTS / f"subscribe-confirmed-{lang}.png"), full_page=True)
    visitor.close()
    assert not [e for e in errors if "Content Security Policy" in e], errors
    assert _members(engine, list_id) == {address: "active"}
