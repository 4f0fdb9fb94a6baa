"""Support in a real browser: find a user, see why the last verification email failed,
resend it, and see the button wait out the cooldown with a live countdown."""

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

ADDRESS = "x@example.org"


def job_states(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT status FROM delivery_jobs WHERE user_ref = 'user-1001' ORDER BY id"))
            .scalars())


def test_support_sees_the_failure_and_resends_within_the_cooldown(
        page: Any, live_server: LiveServer, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    sink.set_rules({"rules": [{"match": ADDRESS, "reply": "550 5.7.1 Rejected by policy"}]})
    support = make_user("support")
    r = page.request.post(f"{live_server.url}/api/v1/verifications",
                          headers={"Authorization": f"Bearer {support['token']}"},
                          data={"user_id": "user-1001", "email": ADDRESS,
                                "verify_url": "https://app.example/verify?t=abc"})
    assert r.status == 202, r.text()
    wait_for(lambda: job_states(engine) == ["failed"], timeout=30, message="the job to fail")

    login(page, live_server, support)
    page.goto(f"{live_server.url}/support/")
    page.fill("input[name=q]", ADDRESS)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "support-search.png"), full_page=True)
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"/support/users/user-1001$"))

    job = page.locator("article.job").first
    expect(job.locator(".job-state")).to_have_text(
        "Not delivered: rejected by the receiving server as policy/spam (not retried)")
    expect(job.locator("code.reply").first).to_have_text("550 5.7.1 Rejected by policy")
    expect(job).to_contain_text(r.json()["correlation_id"])
    page.screenshot(path=str(ARTIFACTS / "support-failed.png"), full_page=True)

    button = page.locator("#resend-button")
    expect(button).to_be_enabled(timeout=10_000)  # the 5 s cooldown of the first email
    button.click()
    expect(page.locator(".flash-success")).to_contain_text(f"Resent to {ADDRESS}")
    button = page.locator("#resend-button")
    expect(button).to_be_disabled()
    expect(button.locator("[data-countdown-label]")).to_have_text(re.compile(r"^\([1-5] s\)$"))
    page.screenshot(path=str(ARTIFACTS / "support-resent.png"), full_page=True)
    # The countdown is live: the button comes back by itself, without a reload.
    expect(button).to_be_enabled(timeout=10_000)
    expect(button.locator("[data-countdown-label]")).to_have_text("")
    assert len(job_states(engine)) == 2
    with engine.connect() as conn:
        actor = conn.execute(sa.text("SELECT actor FROM audit_log "
                                     "WHERE action = 'verification.resend'")).scalar_one()
    assert actor == support["email"]


def test_disposable_address_is_flagged_with_its_reason(
        page: Any, live_server: LiveServer, make_user: Callable[..., dict[str, Any]]) -> None:
    support = make_user("support")
    r = page.request.post(f"{live_server.url}/api/v1/verifications",
                          headers={"Authorization": f"Bearer {support['token']}"},
                          data={"user_id": 77, "email": "temp@mailinator.com",
                                "verify_url": "https://app.example/verify?t=t"})
    assert r.status == 202 and r.json()["flags"] == ["disposable_domain"]
    login(page, live_server, support)
    page.goto(f"{live_server.url}/support/?q=77")
    page.wait_for_url(re.compile(r"/support/users/77$"))
    notice = page.locator("article.job .flag-notice")
    expect(notice).to_contain_text("Disposable address")
    expect(notice).to_contain_text("mailinator.com is a throwaway-mail domain")
    # The job is sent by the live pool; the page updates itself to say so.
    expect(page.locator("article.job .job-state")).to_contain_text(
        "Accepted by the mail server at", timeout=20_000)
    page.screenshot(path=str(ARTIFACTS / "support-flagged.png"), full_page=True)
