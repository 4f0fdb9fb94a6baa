"""The one redirect check, in Chromium: the probe's payloads in ``?back=``,
``?next=`` and the Dismiss form never send the browser off the site. Chromium drops tab,
CR and LF from URLs and reads a backslash as a slash, so this is where those tricks work
if they work at all; every request to the evil host is recorded (and refused)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from tests.e2e.conftest import LiveServer
from tests.integration.security_fixtures import failed_job

pytestmark = pytest.mark.e2e

# As a browser sends them (percent-encoded where a URL needs it).
PAYLOADS = ["/%09/evil.example.com/phish", "/%0d/evil.example.com", "/%0a/evil.example.com",
            "//evil.example.com/x", "/%5Cevil.example.com", "%5C%5Cevil.example.com",
            "https://evil.example.com/", "/%09%09//evil.example.com"]


def _watch_evil(page: Any) -> list[str]:
    seen: list[str] = []

    def refuse(route: Any) -> None:
        seen.append(route.request.url)
        route.abort()

    page.route(lambda url: urlsplit(url).hostname == "evil.example.com", refuse)
    return seen


def test_back_next_and_dismiss_payloads_stay_on_the_site(
        page: Any, live_server: LiveServer, engine: sa.Engine,
        make_user: Callable[..., dict[str, Any]]) -> None:
    seen = _watch_evil(page)
    host = urlsplit(live_server.url).netloc
    admin = make_user("admin")
    # ?next= after login
    page.goto(f"{live_server.url}/login?next={PAYLOADS[0]}")
    page.fill("input[name=email]", admin["email"])
    page.fill("input[name=password]", admin["password"])
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"^(?!.*/login).*$"))
    assert urlsplit(page.url).netloc == host, page.url
    with engine.begin() as conn:
        jobs = [failed_job(conn, f"f{i}@example.org", "550 5.7.1 blocked")
                for i in range(len(PAYLOADS))]
    for job, payload in zip(jobs, PAYLOADS, strict=True):
        # The back link on the job page
        page.goto(f"{live_server.url}/inbox/{job}?back={payload}")
        page.click("text=« Failed jobs")
        page.wait_for_load_state()
        assert urlsplit(page.url).netloc == host, (payload, page.url)
        # Dismiss with the hidden back field set to the payload (as a forged form would)
        page.goto(f"{live_server.url}/inbox/{job}")
        page.locator("input[name=back]").first.evaluate(
            "(el, value) => { el.value = value; }", payload.replace("%09", "\t")
            .replace("%0d", "\r").replace("%0a", "\n").replace("%5C", "\\"))
        page.click("button:has-text('Dismiss')")
        page.wait_for_load_state()
        assert urlsplit(page.url).netloc == host, (payload, page.url)
    assert not seen, f"the browser went to {seen}"
