"""An admin in a real browser reads a bounce with the receiver's words, corrects it (a full
mailbox read as an unknown user), sees the suppression lifted and the rule kept; a later
bounce with the same reply is read by that rule; in Spanish the admin deletes the rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.e2e.conftest import LiveServer, login
from tests.helpers import accepted_campaign
from workers.after_acceptance import feedback
from workers.after_acceptance.reports import Feedback

pytestmark = pytest.mark.e2e

REPLY = ("550 5.2.2 <{email}>: Recipient address rejected: this mailbox is over its "
         "storage allowance (queue id 4Fz9Qm2kT1z8Xv)")


def _bounce(engine: sa.Engine, email: str, job_id: int) -> int:
    with engine.begin() as conn:
        applied = feedback.apply_event(conn, "mailbox", Feedback(
            "bounce", email, "hard", REPLY.format(email=email), "5.2.2", code="userunknown"),
            job_id, "raw", feedback.Thresholds(complaint_min_sent=1))
    assert applied.event_id is not None
    return applied.event_id


def _suppressed(engine: sa.Engine, email: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT 1 FROM suppressions WHERE email = :e"),
                            {"e": email}).first() is not None


def test_correct_a_bounce_and_the_rule_reads_the_next(
        page: Any, live_server: LiveServer, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    _campaign, jobs = accepted_campaign(engine, ["ann@example.com", "bob@example.net"])
    first = _bounce(engine, "ann@example.com", jobs["ann@example.com"]["id"])
    assert _suppressed(engine, "ann@example.com")

    login(page, live_server, make_user("admin"))
    page.goto(f"{live_server.url}/health/")
    page.get_by_role("link", name="Bounce review").first.click()
    row = page.locator(f"#event-{first}")
    expect(row).to_contain_text("this mailbox is over its storage allowance")
    expect(row.locator(".bounce-reason")).to_have_text("user unknown")
    row.locator("details.correct summary").click()
    row.locator("select[name=reason]").select_option("mailboxfull")
    pattern = row.locator("input[name=pattern]").input_value()
    assert "over its storage allowance" in pattern and "ann@" not in pattern
    row.locator("button[type=submit]").click()
    expect(page.locator(".flash-success")).to_contain_text(
        "Corrected: this bounce now reads “mailbox full”")
    expect(page.locator(".flash-success")).to_contain_text("Its suppression was lifted.")
    expect(page.locator(f"#event-{first} .corrected")).to_contain_text(
        "the reader said “user unknown”")
    expect(page.locator("#bounce-rules-table")).to_contain_text("over its storage allowance")
    assert not _suppressed(engine, "ann@example.com")

    second = _bounce(engine, "bob@example.net", jobs["bob@example.net"]["id"])
    page.reload()
    expect(page.locator(f"#event-{second} .bounce-reason")).to_have_text("mailbox full")
    expect(page.locator(f"#event-{second} .ruled")).to_contain_text("by the rule")
    expect(page.locator("#bounce-rules-table")).to_contain_text("1 time")
    assert not _suppressed(engine, "bob@example.net")

    page.context.set_extra_http_headers({"Accept-Language": "es"})
    page.reload()
    expect(page.locator("h1")).to_have_text("Revisión de rebotes")
    expect(page.locator("#bounce-rules h2")).to_have_text("Reglas")
    expect(page.locator(f"#event-{first}")).to_contain_text("buzón de rebotes")
    page.locator("#bounce-rules-table button[type=submit]").click()
    expect(page.locator(".flash-success")).to_contain_text("Regla eliminada")
    expect(page.locator("#bounce-rules-table")).to_have_count(0)
