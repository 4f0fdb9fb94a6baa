"""The preference page in a real browser, in English and Spanish: a
campaign message reaches the test SMTP sink; its unsubscribe link opens the page listing
the person's lists; leaving the campaign's list leaves the other one (the page says so);
the language is chosen there; and the person joins again only through the public form's
double opt-in (a new confirmation email, followed and confirmed)."""

from __future__ import annotations

import email
import email.policy
import re
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer
from webapp.domain import campaigns, lists, subscriptions

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"leave": "Leave “Garden club”", "left": "has left: Garden club.",
           "still": "You are still on: Offers.", "save": "Save my preferences",
           "subscribe": "Subscribe", "done": "check your inbox", "yes": "Yes, subscribe me",
           "subscribed": "You are subscribed", "other": "es",
           "other_heading": "Tus suscripciones", "other_saved": "Tu idioma ahora es español."},
    "es": {"leave": "Salir de “Garden club”", "left": "ha salido de: Garden club.",
           "still": "Sigues en: Offers.", "save": "Guardar mis preferencias",
           "subscribe": "Suscribirme", "done": "revisa tu correo", "yes": "Sí, suscribirme",
           "subscribed": "Ya estás suscrito", "other": "en",
           "other_heading": "Your subscriptions",
           "other_saved": "Your language is now English."},
}


def _mail_to(sink: Any, address: str, subject: str) -> email.message.EmailMessage | None:
    for raw in sink.raw_messages():
        message = email.message_from_bytes(raw, policy=email.policy.default)
        if address in str(message["To"]) and subject in str(message["Subject"]):
            return message
    return None


def _link(message: email.message.EmailMessage, pattern: str) -> str:
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    found = re.search(pattern, body.get_content())
    assert found, body.get_content()
    return found[0]


def _lists_of(engine: sa.Engine, address: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT l.name FROM memberships m JOIN lists l ON l.id = m.list_id "
            "JOIN subscribers s ON s.id = m.subscriber_id WHERE s.email = :e"),
            {"e": address}).scalars())


@pytest.mark.parametrize("lang", ["en", "es"])
def test_leave_one_list_choose_language_and_join_again(
        browser: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        lang: str) -> None:
    words = WORDS[lang]
    address = f"reader-{lang}@example.org"
    with engine.begin() as conn:
        garden = lists.create_list(conn, "Garden club")["id"]
        offers = lists.create_list(conn, "Offers")["id"]
        for list_id in (garden, offers):
            lists.add_subscribers(conn, list_id, [{"email": address, "name": "Vera"}])
        subscriptions.save_form(conn, garden, enabled=True, title="", intro="",
                                accent="#2b6cb0", actor="t")
        campaign = campaigns.create(conn, {
            "name": "Spring", "list_id": garden, "subject": "Spring seeds",
            "text": "Hello.\nUnsubscribe: {{ unsubscribe_url }}"},
            default_from="news@example.com")
        campaigns.send(conn, campaign["id"])
    message = wait_for(lambda: _mail_to(sink, address, "Spring seeds"), timeout=60,
                       message="the campaign message in the sink")
    assert "List-Unsubscribe=One-Click" in str(message["List-Unsubscribe-Post"])
    link = _link(message, r"http://\S+/u/\S+")
    assert f"<{link}>" in str(message["List-Unsubscribe"])

    context = browser.new_context(locale=lang, extra_http_headers={"Accept-Language": lang})
    page = context.new_page()
    page.goto(link)
    form = page.locator("#preferences")
    expect(form).to_contain_text("Garden club")
    expect(form).to_contain_text("Offers")
    page.get_by_role("button", name=words["leave"]).click()
    said = page.locator("#what-happened")
    expect(said).to_contain_text(words["left"])
    expect(said).to_contain_text(words["still"])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"preferences-left-{lang}.png"), full_page=True)
    assert _lists_of(engine, address) == {"Offers"}

    page.select_option("#locale", words["other"])
    page.get_by_role("button", name=words["save"]).click()
    expect(page.locator("#language-saved")).to_have_text(words["other_saved"])
    page.goto(link)  # the chosen language wins over the browser's
    expect(page.locator("h2")).to_have_text(words["other_heading"])
    page.screenshot(path=str(ARTIFACTS / f"preferences-language-{lang}.png"), full_page=True)

    page.goto(f"{live_server.url}/subscribe/{garden}?lang={lang}")
    page.fill("input[name=email]", address)
    page.get_by_role("button", name=words["subscribe"], exact=True).click()
    expect(page.locator("#subscribe-done")).to_contain_text(words["done"])
    assert _lists_of(engine, address) == {"Offers"}  # not before the new consent
    confirmation = wait_for(lambda: _mail_to(sink, address, "Garden club"), timeout=60,
                            message="the confirmation email in the sink")
    page.goto(_link(confirmation, r"http://\S+/subscribe/confirm/\S+"))
    page.get_by_role("button", name=words["yes"]).click()
    expect(page.locator("h1")).to_have_text(words["subscribed"])
    context.close()
    assert _lists_of(engine, address) == {"Offers", "Garden club"}
