"""The three journeys in a real browser, in English and in Spanish: what a
marketer, a support agent and an admin see, in the language their browser asks for."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer
from tests.helpers import enqueue_verification, place_jobs

pytestmark = pytest.mark.e2e

PASSWORD = "demo-password-123"
WORDS = {
    "en": {"dashboard": "Dashboard", "review": "Review and send…", "send": "Send now to",
           "sent": "sent", "done": "100.0 %", "resend": "Resend to", "jobs": "Jobs",
           "failed_tab": "Failed", "retry_all": r"Retry (all \d+|the one) matching",
           "user": "User u-77", "login": "Log in"},
    "es": {"dashboard": "Panel", "review": "Revisar y enviar…", "send": "Enviar ahora a",
           "sent": "enviada", "done": "100,0 %", "resend": "Reenviar a", "jobs": "Trabajos",
           "failed_tab": "Fallidos", "retry_all": r"Reintentar (los \d+|el único) que coincide",
           "user": "Usuario u-77", "login": "Iniciar sesión"},
}


@contextmanager
def _session(browser: Any, server: LiveServer, lang: str, email: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang,
                                  extra_http_headers={"Accept-Language": lang})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{server.url}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.get_by_role("button", name=WORDS[lang]["login"]).click()
    page.wait_for_url(re.compile(r"^(?!.*/login).*$"))
    yield page
    context.close()
    assert not [e for e in errors if "Content Security Policy" in e], errors


@pytest.mark.parametrize("lang", ["en", "es"])
def test_marketer_support_and_admin_journeys(browser: Any, live_server: LiveServer,
                                             engine: sa.Engine, sink: Any, lang: str) -> None:
    from webapp import demo

    words = WORDS[lang]
    sink.set_rules(demo.SINK_RULES)
    with engine.begin() as conn:
        demo.seed(conn, 120, PASSWORD)
        job_id = enqueue_verification(conn, "ana.garcia@example.org", "u-77")
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'failed', attempts = 1, finished_at = now(),
                   last_error = '550 5.7.1 blocked', last_error_class = 'rejected'
             WHERE id = :j"""), {"j": job_id})

    # Marketer: from the dashboard to a sent campaign, in the browser's language.
    with _session(browser, live_server, lang, "marketer@example.com") as page:
        # The campaigns list's twelve columns fit in the window, in Spanish too.
        page.goto(f"{live_server.url}/campaigns/")
        expect(page.locator("#campaign-table")).to_contain_text("November newsletter")
        assert page.evaluate("""() => { const card = document.querySelector('#campaign-table')
            .closest('.card'); return card.scrollWidth <= card.clientWidth; }""")
        page.goto(f"{live_server.url}/")
        expect(page.locator("h1")).to_have_text(words["dashboard"])
        page.get_by_role("link", name="November newsletter").first.click()
        page.get_by_role("link", name=words["review"]).click()
        page.get_by_role("button", name=re.compile(words["send"])).click()
        expect(page.locator("#campaign-status")).to_have_text(words["sent"], timeout=90_000)
        expect(page.locator("#campaign-percent")).to_have_text(words["done"])

    # Support: a part of the address finds the user; the page says what can be done.
    with _session(browser, live_server, lang, "support@example.com") as page:
        page.goto(f"{live_server.url}/support/?q=garcia")
        expect(page.locator("h1")).to_have_text(words["user"])
        expect(page.locator("#resend-button")).to_contain_text(words["resend"])
        expect(page.locator("body")).to_contain_text("550 5.7.1 blocked")

    # Admin: the jobs browser's failed tab is the inbox, with "retry all N" stated.
    with _session(browser, live_server, lang, "admin@example.com") as page:
        page.locator("nav.mainnav").get_by_role("link", name=words["jobs"], exact=True).click()
        page.locator("#job-tabs").get_by_role("link", name=re.compile(words["failed_tab"])
                                              ).click()
        expect(page.locator("#retry-all-button")).to_have_text(re.compile(words["retry_all"]))
