"""Admins in a real browser: find a bounced address and clear it with a note, then see the
change in the audit log; retry all failed jobs of one campaign from the inbox and watch
them go out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer, login
from tests.helpers import campaign_status, jobs_by_email, make_campaign, suppressed

pytestmark = pytest.mark.e2e


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"admin-{name}.png"), full_page=True)


def test_admin_clears_a_bounced_address_and_finds_it_in_the_audit_log(
        page: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    sink.set_rules({"rules": [{"match": "gone@example.org",
                               "reply": "550 5.1.1 <gone@example.org>: user unknown"}]})
    campaign = make_campaign(engine, ["gone@example.org", "fine@example.org"],
                             name="Spring news")
    wait_for(lambda: "gone@example.org" in suppressed(engine), timeout=30,
             message="the hard bounce to suppress the address")
    wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30,
             message="the campaign to finish")
    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/admin/suppressions")
    page.fill("input[name=q]", "gone@")
    page.click("form[role=search] button[type=submit]")
    row = page.locator("#suppressions tbody tr", has_text="gone@example.org")
    expect(row).to_contain_text("550 5.1.1 <gone@example.org>: user unknown")
    expect(row).to_contain_text("Spring news")
    expect(row.locator(".badge")).to_have_text("bounced")
    shot(page, "suppressions")

    page.fill("input[name=note]", "Mailbox restored, confirmed by phone")
    row.locator("button[name=only]").click()
    expect(page.locator(".flash-success")).to_contain_text("Cleared gone@example.org")
    expect(page.locator("#suppressions")).to_have_count(0)
    assert "gone@example.org" not in suppressed(engine)

    page.click("nav.mainnav >> text=Audit log")
    page.fill("input[name=target]", "gone@example.org")
    page.click("form[role=search] button[type=submit]")
    entry = page.locator("#audit tbody tr").first
    expect(entry).to_contain_text("suppression.clear")
    expect(entry).to_contain_text("Mailbox restored, confirmed by phone")
    shot(page, "audit")


def test_admin_retries_a_campaigns_failed_jobs_and_watches_them_go_out(
        page: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    blocked = [f"blocked{i}@example.org" for i in range(3)]
    sink.set_rules({"rules": [{"match": "blocked*@example.org",
                               "reply": "550 5.7.1 Message rejected by policy <script>"}]})
    other = make_campaign(engine, ["blocked9@example.org"], name="Other campaign")
    campaign = make_campaign(engine, [*blocked, "ok1@example.org", "ok2@example.org"],
                             name="Autumn sale")
    for c in (campaign, other):
        wait_for(lambda c=c: campaign_status(engine, c["id"]) == "sent", timeout=30,
                 message="campaigns to finish")
    sink.set_rules({"rules": []})

    login(page, live_server, make_user("admin"))
    page.click("nav.mainnav >> text=Failed jobs")
    expect(page.locator("#inbox tbody tr")).to_have_count(4)
    page.select_option("select[name=campaign]", label=f"Autumn sale (#{campaign['id']})")
    page.click("form[role=search] button[type=submit]")
    rows = page.locator("#inbox tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("550 5.7.1 Message rejected by policy <script>")
    shot(page, "inbox")

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("form.retry-all button[type=submit]")
    expect(page.locator(".flash-success")).to_contain_text("Retried 3 jobs")
    wait_for(lambda: all(jobs_by_email(engine, campaign["id"])[e]["status"] == "sent"
                         for e in blocked), timeout=30, message="the retried jobs to go out")
    page.reload()
    expect(page.locator("text=No failed or bounced job matches these filters.")).to_be_visible()
    assert jobs_by_email(engine, other["id"])["blocked9@example.org"]["status"] == "failed"
    assert sorted(r for rec in sink.records() for r in rec["rcpt_tos"]
                  if r.startswith("blocked")) == blocked

    page.click("nav.mainnav >> text=Queue health")
    expect(page.locator("svg.chart")).to_be_visible()
    expect(page.locator("#workers")).to_contain_text("live")
    shot(page, "health")
    page.click("nav.mainnav >> text=Users & tokens")
    shot(page, "users")
