"""Transactional kinds in a real browser (docs/design.md §21): support opens a user and sees that
the onboarding email was caused by the event ``signup`` with its id; an admin sees the kind on
the Transactional page."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from tests.conftest import wait_for
from tests.e2e.conftest import ARTIFACTS, LiveServer, login

pytestmark = pytest.mark.e2e

ONBOARDING = {"class": "lifecycle", "subject": "{{ data.first_name }}, finish setting up",
              "text": "Hi {{ data.first_name }}!\n", "dedupe_window": 86400,
              "sample_data": {"first_name": "Ada"}}


def test_support_sees_the_event_that_caused_an_onboarding_email(
        page: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    admin, support = make_user("admin"), make_user("support")
    r = page.request.put(f"{live_server.url}/api/v1/kinds/onboarding",
                         headers={"Authorization": f"Bearer {admin['token']}"},
                         data=ONBOARDING)
    assert r.status == 201, r.text()
    r = page.request.post(f"{live_server.url}/api/v1/messages",
                          headers={"Authorization": f"Bearer {support['token']}"},
                          data={"kind": "onboarding", "user_id": "user-2002",
                                "email": "ada@example.org", "data": {"first_name": "Ada"},
                                "event": {"name": "signup", "id": "evt_8c1f",
                                          "at": "2026-12-01T09:00:00Z", "plan": "pro"}})
    assert r.status == 202, r.text()

    def sent() -> bool:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT status FROM delivery_jobs WHERE kind = "
                                        "'onboarding'")).scalar() == "sent"

    wait_for(sent, timeout=30, message="the onboarding email to be sent")

    login(page, live_server, support)
    page.goto(f"{live_server.url}/support/")
    page.fill("input[name=q]", "user-2002")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"/support/users/user-2002$"))
    section = page.locator("#kind-onboarding")
    expect(section.locator("h2")).to_contain_text("onboarding")
    event = section.locator("article.job .event").first
    expect(event.locator(".event-name")).to_have_text("signup")
    expect(event.locator(".event-id")).to_have_text("evt_8c1f")
    expect(event).to_contain_text("2026-12-01T09:00:00Z")
    expect(event).to_contain_text("pro")
    expect(section.locator("article.job .job-state").first).to_contain_text(
        "Accepted by the mail server")
    expect(page.locator("#resend-button-onboarding")).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "support-onboarding-event.png"), full_page=True)

    page.context.clear_cookies()
    login(page, live_server, admin)
    page.goto(f"{live_server.url}/transactional/")
    row = page.locator("#kind-onboarding")
    expect(row).to_contain_text("lifecycle")
    expect(row.locator("[data-stat=sent]")).to_have_text("1")
    page.screenshot(path=str(ARTIFACTS / "transactional-page.png"), full_page=True)
