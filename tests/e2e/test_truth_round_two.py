"""What an earlier walk saw, walked again in a real browser, in English and in Spanish: a
cancelled campaign reads how far it got (never "100 %"), the campaigns list has its
Cancelled column and fits the window, the jobs browser's Sent and Cancelled tabs and its
"choose all" + bulk action (app.js), and inbox rows that keep an address on one line."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from tests.helpers import make_campaign, place_jobs
from webapp.domain import campaigns
from workers import queue

pytestmark = pytest.mark.e2e

WORDS = {
    "en": {"cancelled_after": r"Cancelled after \d+ of 30 \(", "column": "Cancelled",
           "never_sent": "never sent (cancelled)", "tab": "Cancelled", "sent_tab": "Sent",
           "choose_all": "Choose all on this page", "cancel": "Cancel the chosen",
           "done": "3 jobs cancelled."},
    "es": {"cancelled_after": r"Cancelada tras \d+ de 30 \(", "column": "Cancelados",
           "never_sent": "nunca enviados (cancelados)", "tab": "Cancelados",
           "sent_tab": "Enviados", "choose_all": "Elegir todos los de esta página",
           "cancel": "Cancelar los elegidos", "done": "3 trabajos cancelados."},
}


def _held_campaign(engine: sa.Engine) -> dict[str, Any]:
    """A campaign of 30 whose jobs exist but stay out of the pool's reach (paused)."""
    campaign = make_campaign(engine, [f"c{i:02d}@example.org" for i in range(30)],
                             name="Winter sale", send=False)
    with engine.begin() as conn:
        campaigns.send(conn, campaign["id"], actor="tests")
        campaigns.pause(conn, campaign["id"], actor="tests")
        broadcast = conn.execute(sa.text("SELECT broadcast_id FROM campaigns WHERE id = :c"),
                                 {"c": campaign["id"]}).scalar_one()
        queue.enqueue_broadcast(conn, broadcast)
    return campaign


@pytest.mark.parametrize("lang", ["en", "es"])
def test_cancelled_campaign_jobs_tabs_and_bulk_cancel(
        browser: Any, live_server: LiveServer, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]], lang: str) -> None:
    words = WORDS[lang]
    cancelled = _held_campaign(engine)
    with engine.begin() as conn:
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'sent', attempts = 1, finished_at = now()
             WHERE id IN (SELECT id FROM delivery_jobs WHERE campaign_id = :c ORDER BY id
                          LIMIT 8)"""), {"c": cancelled["id"]})
        campaigns.cancel(conn, cancelled["id"], actor="tests")
    waiting = _held_campaign(engine)  # its 30 jobs wait (paused): the bulk cancel's target
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang,
                                  extra_http_headers={"Accept-Language": lang})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        login(page, live_server, make_user("admin"))
        page.goto(f"{live_server.url}/campaigns/{cancelled['id']}")
        summary = page.locator("#campaign-cancelled-summary")
        expect(summary).to_have_text(re.compile(words["cancelled_after"]))
        expect(summary).to_contain_text(words["never_sent"])
        expect(page.locator("#campaign-live")).not_to_contain_text("100")
        page.goto(f"{live_server.url}/campaigns/")
        expect(page.locator("#campaign-table thead")).to_contain_text(words["column"])
        row = page.locator("#campaign-table tbody tr", has_text="Winter sale").first
        assert page.evaluate("""() => { const card = document.querySelector('#campaign-table')
            .closest('.card'); return card.scrollWidth <= card.clientWidth; }""")
        expect(row).to_be_visible()

        page.goto(f"{live_server.url}/jobs/?state=sent")
        tabs = page.locator("#job-tabs")
        expect(tabs.locator('[data-tab="sent"]')).to_contain_text(words["sent_tab"])
        expect(page.locator("#jobs tbody tr")).to_have_count(8)
        tabs.locator('[data-tab="cancelled"]').click()
        expect(tabs.locator('[aria-current="page"]')).to_contain_text(words["tab"])
        expect(page.locator("#jobs tbody tr")).to_have_count(22)

        page.goto(f"{live_server.url}/jobs/?state=waiting&campaign={waiting['id']}")
        page.get_by_label(words["choose_all"]).check()
        assert page.locator('input[name=job]:checked').count() == 30
        page.get_by_label(words["choose_all"]).uncheck()
        boxes = page.locator("input[name=job]")
        for i in range(3):
            boxes.nth(i).check()
        page.get_by_role("button", name=words["cancel"]).click()
        expect(page.locator(".flash-success")).to_have_text(words["done"])
        expect(page.locator("#jobs tbody tr")).to_have_count(27)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"jobs-bulk-{lang}.png"), full_page=True)
    finally:
        context.close()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM delivery_jobs WHERE campaign_id = :c "
                                    "AND status = 'cancelled'"), {"c": waiting["id"]}
                            ).scalar() == 3


def test_inbox_rows_keep_an_address_on_one_line(
        page: Any, live_server: LiveServer, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.integration.security_fixtures import failed_job

    with engine.begin() as conn:
        for i in range(3):
            failed_job(conn, f"bounce-{480 + i}@long-subdomain.example.net",
                       "550 5.1.1 The email account that you tried to reach does not exist")
    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/inbox/")
    cell = page.locator("#inbox tbody td.email").first
    expect(cell).to_contain_text("bounce-")
    lines = page.evaluate("""() => Array.from(document.querySelectorAll('#inbox td.email'))
        .map(td => { const r = document.createRange(); r.selectNodeContents(td.firstChild);
                     return new Set(Array.from(r.getClientRects()).map(x => x.top)).size; })""")
    assert lines == [1, 1, 1], lines  # one line each, not 3-4 beside unused margins
    assert page.evaluate("""() => { const card = document.querySelector('#inbox')
        .closest('.card'); return card.scrollWidth <= card.clientWidth; }""")
